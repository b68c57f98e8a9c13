package pgstore

import "github.com/slotctl/slotctl/store/policy"

// PauseAfterLock makes every step of st call fn once it holds the lock.
func PauseAfterLock(st any, fn func()) { st.(*policy.Store).Backend().(*backend).afterLock = fn }
