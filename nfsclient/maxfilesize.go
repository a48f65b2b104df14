package nfsclient

// MaxFileSize returns the export's FATTR4_MAXFILESIZE (RFC 8881
// s5.8.2.20), fetched at mount: the largest size a file of the export
// can have. Zero means the server did not say.
func (c *Client) MaxFileSize() uint64 { return c.maxLen }
