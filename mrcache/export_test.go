package mrcache

// The pool's shape, for its external tests.
const (
	BlocksPerChunk = blocksPerChunk
	UpperShareNum  = upperShareNum
	UpperShareDen  = upperShareDen
)
