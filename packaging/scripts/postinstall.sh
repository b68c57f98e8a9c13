#!/bin/sh
# slotctl package, after install or upgrade (deb: configure; rpm: $1 >= 1).
# Creates the group slotctl and the reaper's user slotctl-reap (also in
# /usr/lib/sysusers.d/slotctl.conf), lays out the shared store directory
# /var/lib/slotctl as /usr/lib/tmpfiles.d/slotctl.conf says (the one place for
# its owners and modes: read here, d and f lines only), and makes systemd see
# the reap timer. It does not enable the timer.
#
# The layout: the directory root:slotctl 3770 (setgid + sticky) and the
# store's files in it pre-created and owned by root, so that no member can
# replace another's or root's files. An upgrade from the 2770 layout, where
# members created those files, keeps the store: each one is moved into a
# root-only directory (rename: no symlink followed, nothing a member can swap
# any more), checked there (type, one link), given to root and put back. One
# that is a symlink, of the wrong type or hard-linked elsewhere is left in
# that directory, with a warning, and a fresh one is made.
set -e
export LC_ALL=C

case "$1" in
configure | [0-9]*) ;;
*) exit 0 ;;
esac

layout=/usr/lib/tmpfiles.d/slotctl.conf
dir=/var/lib/slotctl

warn() { echo "slotctl: postinstall: $*" >&2; }

if ! getent group slotctl >/dev/null 2>&1; then
	groupadd --system slotctl
fi
if ! getent passwd slotctl-reap >/dev/null 2>&1; then
	nologin=$(command -v nologin || echo /usr/sbin/nologin)
	useradd --system --gid slotctl --home-dir / --no-create-home \
		--shell "$nologin" --comment "slotctl reaper" slotctl-reap
fi

# kind PATH: "file", "directory", "symbolic link", ... (never following a
# symlink), then the owner's uid and the link count; "none" if absent.
kind() {
	if [ -e "$1" ] || [ -L "$1" ]; then
		stat -c '%F|%u|%h' -- "$1"
	else
		echo none
	fi
}

# sound TYPE KIND: the stat line is what a d (directory) or f (regular file,
# one link) line wants.
sound() {
	case "$1|$2" in
	"d|directory|"*) return 0 ;;
	"f|regular file|"*"|1" | "f|regular empty file|"*"|1") return 0 ;;
	esac
	return 1
}

# what TYPE: the word for a d or f line.
what() { if [ "$1" = d ]; then echo directory; else echo "regular file"; fi; }

# set_perms TYPE PATH MODE USER GROUP: PATH is sound and nobody but root can
# replace it (root's, in the sticky directory, or in the stage).
# The extra leading 0: GNU chmod keeps a directory's setgid bit unless told.
set_perms() {
	chown -h "$4:$5" -- "$2"
	chmod "0$3" -- "$2"
}

stage=
# place TYPE PATH MODE USER GROUP: make PATH what the line says.
place() {
	name=${2##*/}
	if [ -z "$stage" ]; then
		stage=$(mktemp -d "$dir/.postinstall.XXXXXX")
		chown root:root -- "$stage" # not the setgid directory's group
		chmod 00700 -- "$stage"
	fi
	for try in 1 2 3; do
		k=$(kind "$2")
		case "$k" in
		none)
			# Made in the stage, then linked (files) or renamed (directories)
			# into place: neither replaces what a member may have put there
			# meanwhile; the next try deals with that.
			new="$stage/new.$name"
			rm -rf -- "$new"
			if [ "$1" = d ]; then
				mkdir -- "$new"
			else
				: >"$new"
			fi
			set_perms "$1" "$new" "$3" "$4" "$5"
			if [ "$1" = d ]; then
				mv -T -- "$new" "$2" 2>/dev/null && return 0
			else
				ln -T -- "$new" "$2" 2>/dev/null && rm -f -- "$new" && return 0
			fi
			;;
		*"|0|"*)
			# root's: in the sticky directory no member can replace it.
			if sound "$1" "$k"; then
				set_perms "$@"
				return 0
			fi
			mv -T -- "$2" "$stage/$name.$try"
			warn "$2 is not a $(what "$1") of its own ($k: type|owner|links): moved to $stage/$name.$try, made a new one"
			;;
		*)
			# a member's: take it out of their reach first.
			held="$stage/$name.$try"
			mv -T -- "$2" "$held" 2>/dev/null || continue # gone meanwhile: again
			k=$(kind "$held")
			if sound "$1" "$k"; then
				set_perms "$1" "$held" "$3" "$4" "$5"
				if [ "$1" = d ]; then
					mv -T -- "$held" "$2" 2>/dev/null && return 0
					warn "$2 reappeared while it was being fixed: the one fixed is in $held"
				else
					# A file a member put there meanwhile is replaced, never
					# followed (rename).
					mv -fT -- "$held" "$2" && return 0
					warn "$2 reappeared as something else while it was being fixed: the one fixed is in $held"
				fi
			else
				warn "$2 is not a $(what "$1") of its own ($k: type|owner|links): moved to $held, made a new one"
			fi
			;;
		esac
	done
	warn "$2: could not be laid out (it keeps changing); run the package's configuration again"
}

if [ -L "$dir" ] || { [ -e "$dir" ] && [ ! -d "$dir" ]; }; then
	warn "$dir is not a directory: left alone, the shared store is not set up"
else
	grep -E '^[df][[:space:]]' "$layout" | while read -r type path mode user group _; do
		case "$path" in
		"$dir")
			mkdir -p -- "$dir"
			chown "$user:$group" -- "$dir"
			chmod "0$mode" -- "$dir"
			;;
		"$dir"/*/* | "$dir"/.*)
			warn "$layout: $path: only entries directly in $dir are laid out here"
			;;
		"$dir"/*)
			place "$type" "$path" "$mode" "$user" "$group"
			# The lock first: then held while the others are fixed, so that
			# no slotctl (of the old package, still running) writes the store
			# while it is away.
			case "$path" in
			*.lock)
				if [ -f "$path" ] && [ ! -L "$path" ] && command -v flock >/dev/null 2>&1; then
					exec 9<"$path"
					flock -w 10 9 || warn "$path: still locked after 10s: the store is fixed without the lock"
				else
					warn "$path: not locked while the store is fixed"
				fi
				;;
			esac
			;;
		*)
			warn "$layout: $path is not in $dir: not laid out here"
			;;
		esac
	done
	find "$dir" -maxdepth 1 -name '.postinstall.*' -type d -empty -delete
fi

if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
	# An enabled timer picks up a new unit file; a disabled one stays off.
	systemctl try-restart slotctl-reap.timer >/dev/null 2>&1 || true
	systemctl try-restart slotctl-metrics.timer >/dev/null 2>&1 || true
fi
exit 0
