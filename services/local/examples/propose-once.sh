#!/bin/sh
# An example planner agent: proposes one change through the front door
# (`airlockctl propose`, the task builder), waits for the outcome and
# prints it as JSON, then stays alive as a long-running agent would (a
# real agent would ask its model for the next change). Run it as an
# [[agent]] of airlock-local:
#
#   command = ["/bin/sh", "/path/to/propose-once.sh", "/path/to/airlockctl",
#              "/var/lib/airlock-local/airlock.toml", "demo", "/path/to/fix.patch",
#              "python3 -m py_compile calc.py"]
#
# Arguments: AIRLOCKCTL CONFIG REPOSITORY PATCH VERIFY. It reads
# DBUS_SYSTEM_BUS_ADDRESS, which airlock-local's agent host sets.
set -eu
"$1" --json --no-ask-password propose --config "$2" --repo "$3" --base main \
    --patch "$4" --verify "$5" --max-attempts 1 --wait
exec sleep 2147483647
