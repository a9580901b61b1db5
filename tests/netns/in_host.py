"""Run a command as if on its own host: set the hostname of the current (fresh) UTS namespace, then exec.

Usage (inside `ip netns exec NS unshare --uts --`): in_host.py HOSTNAME -- COMMAND [ARGS...]
"""

import os
import socket
import sys

if __name__ == "__main__":
    sep = sys.argv.index("--")
    socket.sethostname(sys.argv[1])
    argv = sys.argv[sep + 1 :]
    os.execvp(argv[0], argv)
