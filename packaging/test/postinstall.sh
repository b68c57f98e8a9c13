#!/usr/bin/env bash
# The package's postinstall script, run for real as root in a private mount
# namespace (a copy of /etc, tmpfs over /var/lib and /usr/lib/tmpfiles.d, so
# the host is never touched): a fresh install, an upgrade from the 2770
# layout that members filled, and an upgrade where members planted symlinks
# and hard links. Each asserts the 3770 layout of packaging/tmpfiles.d, that
# the store's data survive, and that nothing outside the store changed.
#
#   packaging/test/postinstall.sh [POSTINST [TMPFILES_CONF]]
#
# Defaults: packaging/scripts/postinstall.sh and packaging/tmpfiles.d/slotctl.conf
# (.ci/package passes the ones from the built deb). Needs root and unshare(1).
set -euo pipefail

here=$(cd "$(dirname "$0")/../.." && pwd)
postinst=$(realpath "${1:-$here/packaging/scripts/postinstall.sh}")
conf=$(realpath "${2:-$here/packaging/tmpfiles.d/slotctl.conf}")

if [ "${SLOTCTL_POSTINST_NS:-}" != inside ]; then
	[ "$(id -u)" -eq 0 ] || { echo "FAIL: $0 needs root" >&2; exit 1; }
	for scenario in fresh upgrade hostile; do
		echo "-- postinstall: $scenario"
		SLOTCTL_POSTINST_NS=inside unshare -m --propagation private "$0" "$postinst" "$conf" "$scenario"
	done
	echo "-- postinstall: all scenarios pass"
	exit 0
fi

scenario=$3
fail() { echo "FAIL ($scenario): $*" >&2; exit 1; }

. "$here/packaging/test/lib.sh"
private_world "$conf"

dir=/var/lib/slotctl
alice=70001 bob=70002

# want PATH TYPE MODE OWNER GROUP: what stat -c '%F %a %U %G' must say.
want() {
	local got
	got=$(stat -c '%F %a %U %G' -- "$1")
	[ "$got" = "$2 $3 $4 $5" ] || fail "$1: want '$2 $3 $4 $5', got '$got'"
}
layout() {
	want $dir directory 3770 root slotctl
	want $dir/slots.db.bells directory 3770 root slotctl
	for f in slots.db slots.db.lock; do
		local t
		t=$(stat -c %F $dir/$f)
		case "$t" in "regular file" | "regular empty file") ;; *) fail "$dir/$f is a $t" ;; esac
		want $dir/$f "$t" 660 root slotctl
		[ "$(stat -c %h $dir/$f)" -eq 1 ] || fail "$dir/$f has $(stat -c %h $dir/$f) links"
	done
	getent passwd slotctl-reap >/dev/null || fail "no user slotctl-reap"
	[ "$(id -gn slotctl-reap)" = slotctl ] || fail "slotctl-reap's group is $(id -gn slotctl-reap)"
	[ "$(getent passwd slotctl-reap | cut -d: -f6)" = / ] || fail "slotctl-reap's home is not /"
}
# snap PATH...: type, mode, owner, links and content of each, to compare.
snap() {
	local p
	for p in "$@"; do
		stat -c '%n %F %a %u %g %h' -- "$p"
		if [ -f "$p" ] && [ ! -L "$p" ]; then sha256sum <"$p"; fi
	done
}
run_postinst() {
	"$postinst" configure 2>"$work/err" || fail "postinst exited $?: $(cat "$work/err")"
	sed 's/^/   postinst said: /' "$work/err" >&2
}

case "$scenario" in
fresh)
	! getent group slotctl >/dev/null || fail "group slotctl already in the copy of /etc"
	run_postinst
	layout
	[ "$(stat -c %s $dir/slots.db)" -eq 0 ] || fail "a fresh slots.db is not empty"
	[ ! -s "$work/err" ] || fail "warnings on a fresh install"
	# Again (dpkg-reconfigure, a reinstall): nothing changes, nothing said.
	before=$(snap $dir $dir/*)
	run_postinst
	[ "$(snap $dir $dir/*)" = "$before" ] || fail "a second run changed the layout"
	[ ! -s "$work/err" ] || fail "warnings on a second run"
	[ -z "$(ls -A $dir | grep -v '^slots\.db')" ] || fail "left behind: $(ls -A $dir)"
	;;
upgrade)
	# The previous package: 2770, the files made by whichever member came first.
	groupadd --system slotctl
	gid=$(getent group slotctl | cut -d: -f3)
	install -d -o root -g slotctl -m 2770 $dir
	head -c 65536 /dev/urandom >$dir/slots.db
	chown $alice:$gid $dir/slots.db && chmod 0660 $dir/slots.db
	: >$dir/slots.db.lock
	chown $bob:$gid $dir/slots.db.lock && chmod 0660 $dir/slots.db.lock
	install -d -o $alice -g $gid -m 2770 $dir/slots.db.bells
	mkfifo -m 0660 $dir/slots.db.bells/t-0123456789abcdef
	chown $bob:$gid $dir/slots.db.bells/t-0123456789abcdef
	data=$(sha256sum <$dir/slots.db)
	run_postinst
	layout
	[ "$(sha256sum <$dir/slots.db)" = "$data" ] || fail "the store's data changed"
	[ -p $dir/slots.db.bells/t-0123456789abcdef ] || fail "a bell in the old bells directory is gone"
	[ ! -s "$work/err" ] || fail "warnings on a clean upgrade"
	[ -z "$(ls -A $dir | grep -v '^slots\.db')" ] || fail "left behind: $(ls -A $dir)"
	;;
hostile)
	# Members planted symlinks and hard links where the store's files go.
	groupadd --system slotctl
	gid=$(getent group slotctl | cut -d: -f3)
	install -d -o root -g slotctl -m 2770 $dir
	mkdir -m 0700 /var/lib/victim
	echo secret >/var/lib/victim/shadow && chmod 0600 /var/lib/victim/shadow
	echo profile >/var/lib/victim/profile && chmod 0644 /var/lib/victim/profile
	mkdir -m 0700 /var/lib/victim/dir
	ln -s /var/lib/victim/shadow $dir/slots.db && chown -h $alice:$gid $dir/slots.db
	# root-owned and hard-linked (protected_hardlinks off, or root was tricked)
	ln /var/lib/victim/profile $dir/slots.db.lock
	ln -s /var/lib/victim/dir $dir/slots.db.bells && chown -h $bob:$gid $dir/slots.db.bells
	victims=$(snap /var/lib/victim /var/lib/victim/*)
	run_postinst
	[ "$(snap /var/lib/victim /var/lib/victim/*)" = "$victims" ] || {
		snap /var/lib/victim /var/lib/victim/* >&2
		fail "a file outside the store changed; before: $victims"
	}
	layout
	for f in slots.db slots.db.lock slots.db.bells; do
		grep -q "$dir/$f is not a" "$work/err" || fail "no warning about $dir/$f"
	done
	# What was planted is kept, out of every member's reach.
	held=$(ls -d $dir/.postinstall.*)
	want "$held" directory 700 root root
	[ "$(readlink "$held"/slots.db.1)" = /var/lib/victim/shadow ] || fail "the planted slots.db symlink is not in $held"
	;;
*) fail "unknown scenario" ;;
esac
