// Package wait holds the context-aware sleep the retry loops of oncrpc
// and nfsclient wait in between attempts.
package wait

import (
	"context"
	"time"
)

// Sleep waits for d, or until ctx ends, whose error it then returns.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
