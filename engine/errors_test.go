package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// A child's setup that timed out connecting (a member died after the
// split's exchange) is ErrTimeout, which an elastic loop takes for a
// peer failure and shrinks again after; it once ended the job (chaos
// seed 1017).
func TestSetupTimeout(t *testing.T) {
	cause := fmt.Errorf("tcp: rank 2: connecting to peers: %w; no connection with ranks [1]", context.DeadlineExceeded)
	err := setupTimeout(cause, "setting up the child", 5*time.Second)
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no connection with ranks [1]") {
		t.Fatalf("got %v", err)
	}
	if again := setupTimeout(err, "x", time.Second); again != err {
		t.Fatalf("wrapped twice: %v", again)
	}
	other := errors.New("refused")
	if got := setupTimeout(other, "x", time.Second); got != other {
		t.Fatalf("got %v, want the error unchanged", got)
	}
}
