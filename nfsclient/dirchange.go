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
	// Listed is set when the directory was read (OpenArgs.ListDir)
	// after its attributes in the same COMPOUND and the whole of it
	// came back: Names is its listing at Attr.Change (anything made
	// after the GETATTR changes the change attribute).
	Listed bool
	Names  []string
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

// decodeListing decodes the READDIR an OPEN with ListDir appends.
func (r *results) decodeListing(dc *DirChange) {
	if r.d.Err() != nil {
		return
	}
	ents, _, eof, err := r.decodeReadDir(nil)
	if err != nil || !eof {
		return
	}
	dc.Names = make([]string, len(ents))
	for i, e := range ents {
		dc.Names[i] = e.Name
	}
	dc.Listed = true
}

// listingProbe bounds the READDIR of OpenArgs.ListDir: names only, one
// reply of a few KiB (about a hundred short names).
const listingProbe = 4096

// emptyDirProbe is the READDIR Mkdir appends: no attributes per entry,
// room for a few names (RFC 8881 s18.23.3: dircount and maxcount are
// byte budgets; a reply that cannot hold one entry is NFS4ERR_TOOSMALL,
// which only loses the knowledge).
const emptyDirProbe = 1024
