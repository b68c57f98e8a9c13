package pgstore

import "github.com/slotctl/slotctl/store/policy"

// PauseAfterLock makes every step of st call fn once it holds the lock.
func PauseAfterLock(st any, fn func()) { st.(*policy.Store).Backend().(*backend).afterLock = fn }

// HoldListener makes st's listener call fn before each connection it makes.
func HoldListener(st any, fn func()) { st.(*policy.Store).Backend().(*backend).beforeListen = fn }
