# Sourced by packaging/test/*.sh, inside their private mount namespace
# (unshare -m): a world where the package's files can be laid out for real
# without touching the host. A copy of /etc (users and groups added here stay
# here), and tmpfs over /var/lib, /usr/lib/tmpfiles.d and /run.
# private_world TMPFILES_CONF: sets $work (a scratch directory).
private_world() {
	work=$(mktemp -d)
	chmod 0755 "$work"
	cp -a /etc "$work/etc"
	mount --bind "$work/etc" /etc
	mount -t tmpfs tmpfs /var/lib
	mount -t tmpfs tmpfs /usr/lib/tmpfiles.d
	cp "$1" /usr/lib/tmpfiles.d/slotctl.conf
	# No /run/systemd/system: the scripts call no systemctl.
	mount -t tmpfs tmpfs /run
}
