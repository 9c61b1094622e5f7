# Shared by the Debian postinst and the RPM %post (scripts/package pastes it
# in where the maintainer script says #CREDENTIALS#).
#
# Makes the two secrets airlock-retryd needs, and airlock-egress's empty
# parent proxy credential, each only when it is missing,
# so that an administrator's own values survive upgrades and reinstalls
# (conffile semantics, although dpkg and rpm do not track these files):
#   /etc/airlock/retry-control.token  48 random characters [A-Za-z0-9], the
#                                     owner's bearer token (root 0600; the
#                                     unit passes it with LoadCredential=)
#   /etc/airlock/retryd.env           AIRLOCK_RETRY_AUTHORIZATION_ID=owner-…
#                                     (root 0600; read by systemd as root)
#   /etc/airlock/egress-parent-proxy.credential
#                                     empty (root 0600): airlock-egress's
#                                     parent proxy credential, user:password,
#                                     for a route's credential = "parent-proxy"
#                                     (the unit's LoadCredential= needs the file)
# Both are written to a temporary file and renamed into place, so an
# interrupted run never leaves a short token behind.
airlock_random() {
    # $1 characters from [A-Za-z0-9], from the kernel's CSPRNG.
    LC_ALL=C tr -dc 'A-Za-z0-9' </dev/urandom | head -c "$1"
}
airlock_make_secret() {
    # $1 path; the content is read from stdin.
    _airlock_tmp="$1.new.$$"
    rm -f "$_airlock_tmp"
    (umask 077 && cat >"$_airlock_tmp")
    chown root:root "$_airlock_tmp"
    chmod 0600 "$_airlock_tmp"
    mv -f "$_airlock_tmp" "$1"
}
mkdir -p /etc/airlock
if [ ! -e /etc/airlock/retry-control.token ]; then
    airlock_random 48 | airlock_make_secret /etc/airlock/retry-control.token
fi
if [ ! -e /etc/airlock/retryd.env ]; then
    {
        echo "# Written once by the airlock package; it is never overwritten."
        echo "# The owner authorization id every retry-extension request must carry."
        echo "AIRLOCK_RETRY_AUTHORIZATION_ID=owner-$(airlock_random 24)"
    } | airlock_make_secret /etc/airlock/retryd.env
fi
if [ ! -e /etc/airlock/egress-parent-proxy.credential ]; then
    airlock_make_secret /etc/airlock/egress-parent-proxy.credential </dev/null
fi
