#!/usr/bin/env bash
# The packaged reaper as the unit runs it, without systemd: the user, group,
# umask, capabilities (ambient and bounding set) and no_new_privs read from
# the shipped unit and applied with setpriv(1), on the layout the postinstall
# script makes, in a private mount namespace (packaging/test/lib.sh). A member
# starts a job whose supervisor then dies, leaving its job running (orphaned):
#  - the reaper without the unit's capabilities cannot tell it is the job's
#    (another user's /proc/PID/environ) and leaves the ticket to its TTL;
#  - the reaper with them reads the store the member wrote, kills the
#    orphaned job and removes its ticket, with the evidence on stdout.
# Seccomp, ProtectSystem= and the other sandboxing need systemd itself and
# are not exercised here (systemd-analyze security only reads the unit).
#
#   packaging/test/reaper.sh SLOTCTL [UNIT [POSTINST [TMPFILES_CONF [CONFIG]]]]
#
# Defaults: the files in packaging/ (.ci/package passes the built deb's).
# Needs root, unshare(1) and setpriv(1).
set -euo pipefail

here=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 1 ] || { echo "usage: $0 SLOTCTL [UNIT [POSTINST [TMPFILES_CONF [CONFIG]]]]" >&2; exit 64; }
bin=$(realpath "$1")
unit=$(realpath "${2:-$here/packaging/systemd/slotctl-reap.service}")
postinst=$(realpath "${3:-$here/packaging/scripts/postinstall.sh}")
conf=$(realpath "${4:-$here/packaging/tmpfiles.d/slotctl.conf}")
config=$(realpath "${5:-$here/packaging/config.yaml}")

if [ "${SLOTCTL_REAPER_NS:-}" != inside ]; then
	[ "$(id -u)" -eq 0 ] || { echo "FAIL: $0 needs root" >&2; exit 1; }
	SLOTCTL_REAPER_NS=inside exec unshare -m --propagation private "$0" "$bin" "$unit" "$postinst" "$conf" "$config"
fi

fail() { echo "FAIL (reaper): $*" >&2; exit 1; }
. "$here/packaging/test/lib.sh"
private_world "$conf"
# Where the reaper and the member can run it whatever the caller's directory.
install -m 0755 "$bin" "$work/slotctl"
# The guard the package installs beside it, which slotctl runs each job under.
install -m 0755 "$(dirname "$bin")/slotctl-guard" "$work/slotctl-guard"
bin=$work/slotctl
mkdir -p /etc/slotctl
cp "$config" /etc/slotctl/config.yaml
"$postinst" configure

# What the unit says.
setting() { sed -n "s/^$1=//p" "$unit" | tail -1; }
user=$(setting User) group=$(setting Group) umask=$(setting UMask)
caps=$(setting AmbientCapabilities)
[ "$caps" = "$(setting CapabilityBoundingSet)" ] || fail "the unit's ambient and bounding capabilities differ"
[ "$(setting NoNewPrivileges)" = yes ] || fail "the unit has no NoNewPrivileges=yes"
exec_start=$(setting ExecStart)
args=${exec_start#/usr/bin/slotctl }
[ "$args" != "$exec_start" ] || fail "ExecStart= does not run /usr/bin/slotctl: $exec_start"
[ -n "$user" ] && [ -n "$group" ] && [ -n "$umask" ] && [ -n "$caps" ] || fail "the unit lacks User=, Group=, UMask= or capabilities"
uid=$(id -u "$user") gid=$(getent group "$group" | cut -d: -f3)
[ "$uid" -ne 0 ] || fail "the reaper runs as root"
# CAP_KILL CAP_SYS_PTRACE -> +kill,+sys_ptrace
setpriv_caps=$(echo "$caps" | tr 'A-Z ' 'a-z\n' | sed 's/^cap_/+/' | paste -sd, -)

# reaper [CAPS]: run the unit's command as the unit would (CAPS: setpriv's
# capability list, "" for none).
reaper() {
	local c=$1
	shift
	(
		umask "$umask"
		exec setpriv --reuid="$uid" --regid="$gid" --groups="$gid" \
			--inh-caps="-all${c:+,$c}" --ambient-caps="-all${c:+,$c}" --bounding-set="-all${c:+,$c}" \
			--no-new-privs \
			env -i PATH=/usr/bin:/bin HOME=/ "$bin" "$@"
	)
}
alice=70001
as_member=(setpriv --reuid=$alice --regid="$gid" --groups="$gid" --inh-caps=-all --bounding-set=-all
	env -i PATH=/usr/bin:/bin "$bin")

# A member's job: its shell starts sleep in the background, in the job's
# process group, and writes its pid down.
jobdir=$work/job
install -d -o $alice -m 0700 "$jobdir"
# A simple command, so that $! is the supervisor itself.
"${as_member[@]}" run --limit build --ttl 1h -- sh -c "sleep 7345 & echo \$! >$jobdir/pid; wait" </dev/null >"$work/run.out" 2>&1 &
sup=$! job=
trap 'kill -KILL $sup $job 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -s "$jobdir/pid" ] && break; sleep 0.05; done
[ -s "$jobdir/pid" ] || fail "the member's job did not start: $(cat "$work/run.out")"
job=$(cat "$jobdir/pid")
# The supervisor records the job's process group just after starting it:
# before that, its death is not provable (the TTL decides).
sleep 1
[ "$(stat -c %U /var/lib/slotctl/slots.db)" = root ] || fail "the store file is not root's any more"

# The supervisor and the job's guard die (SIGKILL: no release), slotctl
# stopped first so that it cannot see its guard die and kill the job
# itself; the shell follows the guard (parent-death signal); sleep is left,
# an orphaned job holding the slot. (slotctl alone dying takes its whole
# job with it: the guard kills it.)
guard=
for p in /proc/[0-9]*; do
	[ "$(cut -d' ' -f4 "$p/stat" 2>/dev/null)" = "$sup" ] && [ "$(cat "$p/comm" 2>/dev/null)" = slotctl-guard ] && guard=${p#/proc/}
done
[ -n "$guard" ] || fail "the member's job runs under no slotctl-guard"
exec 3>&2 2>/dev/null # not bash's "Killed" notice
kill -STOP "$sup"
kill -KILL "$guard"
kill -KILL "$sup"
wait "$sup" || true
exec 2>&3 3>&-
alive() { [ -d "/proc/$1" ] && [ "$(cut -d' ' -f3 "/proc/$1/stat")" != Z ]; }
alive "$job" || fail "the orphaned job died with its supervisor"

# Without the capabilities: the store is read (it is the member's), but the
# job is not provably the ticket's, so nothing is killed or removed.
out=$(reaper "" $args 2>&1) || fail "reap without capabilities failed: $out"
echo "reap without capabilities: $out"
alive "$job" || fail "the reaper without capabilities killed the job"
reaper "" ls --config /etc/slotctl/config.yaml -o json | grep -q '"limit": *"build"' ||
	fail "the ticket is gone after a reap without capabilities: $(reaper "" ls 2>&1)"

# With the unit's: the orphaned job is killed and its ticket removed.
out=$(reaper "$setpriv_caps" $args 2>&1) || fail "reap failed: $out"
echo "reap with $caps: $out"
case "$out" in *"orphaned process group"*"killed"*) ;; *) fail "reap did not kill the orphaned job: $out" ;; esac
for _ in $(seq 40); do alive "$job" || break; sleep 0.05; done
alive "$job" && fail "the orphaned job $job still runs"
left=$(reaper "" ls --config /etc/slotctl/config.yaml -o json)
echo "$left" | grep -q '"holder"' && fail "a ticket is left: $left"
[ "$(stat -c '%U %G %a' /var/lib/slotctl/slots.db)" = "root slotctl 660" ] ||
	fail "the reaper changed the store file's owner or mode: $(stat -c '%U %G %a' /var/lib/slotctl/slots.db)"
echo "-- reaper: the unit's user and capabilities reap another user's orphaned job"
