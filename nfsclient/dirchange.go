package nfsclient

// DirChange is what an operation that changed a directory reports about
// it: the operation's change_info4 (RFC 8881 s3.3.12) and the directory's
// attributes from a GETATTR later in the same COMPOUND. The Linux client
// folds the same GETATTR into CREATE, REMOVE, RENAME and LINK (the
// nfs4_*_res "dir_attr" post-op attributes), so no separate GETATTR of
// the directory has to follow the change.
type DirChange struct {
	Atomic        bool   // Before and After bracket exactly this operation
	Before, After uint64 // the directory's change attribute around it
	Attr          Attr   // the directory's attributes after the operation
	AttrOK        bool   // Attr was returned
	// Empty is set by Mkdir only: the new directory had no entries when
	// its attributes (Made.Attr) were read, so Made.Attr.Change names
	// an empty listing (a READDIR after the GETATTR in the same
	// COMPOUND found nothing; anything created before the GETATTR would
	// have shown, anything after it changes the change attribute).
	Empty bool
}

func (dc *DirChange) setInfo(ci changeInfo) {
	dc.Atomic, dc.Before, dc.After = ci.Atomic, ci.Before, ci.After
}

// decodePostOpAttr decodes a trailing GETATTR the caller can do without:
// the operation it follows has already succeeded, so a failure here (the
// server stopped before it, or a malformed attribute) only means there
// are no attributes. It reports whether a was filled.
func (r *results) decodePostOpAttr(a *Attr) bool {
	if r.d.Err() != nil {
		return false
	}
	return r.decodeGetAttr(a) == nil
}

// decodeEmptyDir decodes the READDIR that Mkdir appends: whether it saw
// the whole directory (EOF) and no entry in it.
func (r *results) decodeEmptyDir() bool {
	if r.d.Err() != nil {
		return false
	}
	ents, _, eof, err := r.decodeReadDir(nil)
	return err == nil && eof && len(ents) == 0
}

// emptyDirProbe is the READDIR Mkdir appends: no attributes per entry,
// room for a few names (RFC 8881 s18.23.3: dircount and maxcount are
// byte budgets; a reply that cannot hold one entry is NFS4ERR_TOOSMALL,
// which only loses the knowledge).
const emptyDirProbe = 1024
