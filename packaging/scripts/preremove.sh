#!/bin/sh
# slotctl package, before removal (deb: remove; rpm: $1 = 0, not on
# upgrade): stop and disable the reap and metrics timers so that no dangling link stays.
set -e

case "$1" in
remove | 0)
	if command -v systemctl >/dev/null 2>&1; then
		systemctl disable --now slotctl-reap.timer >/dev/null 2>&1 || true
		systemctl stop slotctl-reap.service >/dev/null 2>&1 || true
		systemctl disable --now slotctl-metrics.timer >/dev/null 2>&1 || true
		systemctl stop slotctl-metrics.service >/dev/null 2>&1 || true
	fi
	;;
esac
exit 0
