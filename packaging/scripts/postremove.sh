#!/bin/sh
# slotctl package, after removal (deb: remove or purge; rpm: $1 = 0).
# The group slotctl stays (files may still carry it); the shared store in
# /var/lib/slotctl goes only on dpkg --purge.
set -e

case "$1" in
remove | 0)
	;;
purge)
	rm -rf /var/lib/slotctl
	;;
*)
	exit 0
	;;
esac
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
exit 0
