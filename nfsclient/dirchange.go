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
}

func (dc *DirChange) setInfo(ci changeInfo4) {
	dc.Atomic, dc.Before, dc.After = ci.atomic, ci.before, ci.after
}
