#!/bin/sh
# slotctl package, after install or upgrade (deb: configure; rpm: $1 >= 1).
# Creates the group slotctl and the shared store directory /var/lib/slotctl
# (root:slotctl, mode 2770; also in /usr/lib/tmpfiles.d/slotctl.conf), and
# makes systemd see the reap timer. It does not enable the timer.
set -e

case "$1" in
configure | [0-9]*) ;;
*) exit 0 ;;
esac

if ! getent group slotctl >/dev/null 2>&1; then
	groupadd --system slotctl
fi
# Create, or put back the owner and mode of, the shared store directory:
# members of slotctl get in, new files there inherit the group.
install -d -o root -g slotctl -m 2770 /var/lib/slotctl

if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
	# An enabled timer picks up a new unit file; a disabled one stays off.
	systemctl try-restart slotctl-reap.timer >/dev/null 2>&1 || true
fi
exit 0
