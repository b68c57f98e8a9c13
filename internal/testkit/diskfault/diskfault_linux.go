//go:build linux

package diskfault

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// envVar names, in the child process, the test that runs there.
const envVar = "SLOTCTL_DISKFAULT_TEST"

// childTimeout bounds a child test: its faults take well under a second on
// an idle machine; the rest is room for a loaded one.
const childTimeout = 2 * time.Minute

// InNamespace reports whether the calling test runs in its own private
// mount namespace, where it may mount. Called in the test binary itself, it
// runs the test again in a child process unshared from this mount namespace
// (killed with its group should it outlive childTimeout), reports the
// child's outcome as the test's own and returns false; the test then
// returns. It skips where this process is not root or the kernel refuses
// the namespace.
func InNamespace(t *testing.T) bool {
	t.Helper()
	if os.Getenv(envVar) == t.Name() {
		return true
	}
	if os.Geteuid() != 0 {
		t.Skip("real disk faults need root: a private mount namespace, a tmpfs, a loop device")
	}
	var pat []string
	for _, p := range strings.Split(t.Name(), "/") {
		pat = append(pat, "^"+regexp.QuoteMeta(p)+"$")
	}
	ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+strings.Join(pat, "/"), "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), envVar+"="+t.Name())
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err != nil && !errors.As(err, &ee) && ctx.Err() == nil:
		t.Skipf("the kernel refuses a private mount namespace here: %v", err)
	case ctx.Err() != nil:
		t.Fatalf("the test in its mount namespace did not end within %v (killed):\n%s", childTimeout, out)
	case err != nil || strings.Contains(string(out), "--- FAIL"):
		t.Fatalf("in its mount namespace (%v):\n%s", err, out)
	case strings.Contains(string(out), "--- SKIP: "+t.Name()+" "):
		t.Skipf("in its mount namespace:\n%s", out)
	}
	t.Logf("in its mount namespace:\n%s", out)
	return false
}

// Tmpfs mounts a tmpfs of size bytes (rounded up to pages) on dir, private
// to the caller (mode 0700). It skips the test if the kernel refuses.
func Tmpfs(t *testing.T, dir string, size int64) {
	t.Helper()
	if err := unix.Mount("slotctl-test", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		t.Skipf("the kernel refuses a tmpfs mount here: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
}

// Fill takes every free byte of the file system that dir is on, with a
// file in dir, and returns the function that frees them again.
func Fill(t *testing.T, dir string) (free func()) {
	t.Helper()
	name := filepath.Join(dir, ".diskfault-fill")
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatalf("fill %s: %v", dir, err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	// Big writes first, then smaller ones into what is left of the last
	// page or block.
	for _, n := range []int{64 << 10, 4 << 10, 512, 1} {
		for {
			_, err := f.Write(buf[:n])
			if errors.Is(err, unix.ENOSPC) {
				break
			}
			if err != nil {
				t.Fatalf("fill %s: %v", dir, err)
			}
		}
	}
	return func() {
		if err := os.Remove(name); err != nil {
			t.Errorf("free %s: %v", dir, err)
		}
	}
}

// A Disk is an ext2 file system mounted on Dir, on a loop device whose
// backing store is a memfd: the disk's content. Break makes the device
// fail every write; Reattach mounts what the disk holds again on a device
// that works.
type Disk struct {
	t   *testing.T
	Dir string
	img *os.File // the memfd
}

// Ext2 makes a disk of size bytes with an ext2 file system (4 KiB blocks,
// as the kernel's pages) and mounts it on dir. It skips the test where
// there is no mkfs.ext2 or no loop device to be had.
func Ext2(t *testing.T, dir string, size int64) *Disk {
	t.Helper()
	mkfs, err := exec.LookPath("mkfs.ext2")
	if err != nil {
		t.Skip("no mkfs.ext2 (e2fsprogs) to make the failing disk's file system")
	}
	img, err := newImage()
	if err != nil {
		t.Skipf("no memfd for the disk: %v", err)
	}
	d := &Disk{t: t, Dir: dir, img: img}
	t.Cleanup(d.close)
	if err := img.Truncate(size); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a few ms unloaded
	defer cancel()
	if out, err := exec.CommandContext(ctx, mkfs, "-q", "-F", "-b", "4096", d.image()).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext2: %v\n%s", err, out)
	}
	d.mount()
	return d
}

func newImage() (*os.File, error) {
	fd, err := unix.MemfdCreate("slotctl-disk", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), "disk"), nil
}

// image is the path by which another process opens the disk's content.
func (d *Disk) image() string { return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), d.img.Fd()) }

// Break syncs the file system, so that everything written so far is on
// the disk, and then makes the device fail every write from now on: the
// memfd behind it is sealed against writes, which the loop driver reports
// as an I/O error (EIO) to the file system's writeback and so to fsync.
// Reads still work.
func (d *Disk) Break() {
	d.t.Helper()
	d.sync()
	if _, err := unix.FcntlInt(d.img.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE); err != nil {
		d.t.Fatalf("seal the disk against writes: %v", err)
	}
}

func (d *Disk) sync() {
	d.t.Helper()
	fd, err := unix.Open(d.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		d.t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		d.t.Fatalf("syncfs %s: %v", d.Dir, err)
	}
}

// Reattach unmounts the broken file system (lazily: a store still holds
// its directory) and mounts, on Dir, a copy of what the disk holds on a
// device that works: the writes that failed are not there, whatever the
// old mount's page cache still shows. Stores opened before must be opened
// again.
func (d *Disk) Reattach() {
	d.t.Helper()
	if err := unix.Unmount(d.Dir, unix.MNT_DETACH); err != nil {
		d.t.Fatalf("unmount %s: %v", d.Dir, err)
	}
	img, err := newImage()
	if err != nil {
		d.t.Fatal(err)
	}
	old := d.img
	d.img = img // closed by d.close from now on
	defer old.Close()
	if _, err := old.Seek(0, 0); err != nil {
		d.t.Fatal(err)
	}
	if _, err := img.ReadFrom(old); err != nil {
		d.t.Fatalf("copy the disk: %v", err)
	}
	d.mount()
}

// mount attaches the memfd to a free loop device that clears itself when
// unmounted, and mounts its ext2 on Dir.
func (d *Disk) mount() {
	t := d.t
	t.Helper()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no loop devices here: %v", err)
	}
	defer ctl.Close()
	major := uint32(7)
	var st unix.Stat_t
	if unix.Stat("/dev/loop0", &st) == nil {
		major = unix.Major(st.Rdev)
	}
	for range 20 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			t.Skipf("no free loop device: %v", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		if _, err := os.Stat(dev); errors.Is(err, fs.ErrNotExist) {
			// A device the kernel made just now, with no node in this /dev.
			dev = filepath.Join(t.TempDir(), "loop")
			if err := unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(major, uint32(n)))); err != nil {
				t.Skipf("no node for loop device %d: %v", n, err)
			}
		}
		lfd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Skipf("open %s: %v", dev, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(d.img.Fd())}
		cfg.Info.Flags = loFlagsAutoclear
		err = unix.IoctlLoopConfigure(lfd, &cfg)
		if errors.Is(err, unix.EBUSY) {
			unix.Close(lfd) // another process took it first
			continue
		}
		if err != nil {
			unix.Close(lfd)
			t.Skipf("the kernel refuses a loop device here: %v", err)
		}
		err = unix.Mount(dev, d.Dir, "ext2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOATIME, "errors=continue")
		// The mount holds the device now; unmounted, it clears itself.
		unix.Close(lfd)
		if err != nil {
			t.Skipf("the kernel refuses to mount ext2 from a loop device here: %v", err)
		}
		return
	}
	t.Skip("no loop device stayed free long enough")
}

// loFlagsAutoclear: the loop device detaches once nothing holds it.
const loFlagsAutoclear = 4

func (d *Disk) close() {
	_ = unix.Unmount(d.Dir, unix.MNT_DETACH)
	d.img.Close()
}
