# A contender of redis-py's own redis.lock.Lock, driven over stdin/stdout by
# dlock's interop tests (dlock_testkit::reference::python). It runs the
# Lock unchanged: redis-py as installed on the machine (Debian python3-redis),
# on Debian's /usr/bin/python3.
#
# Usage: python3 contender.py REDIS_URL POLL_SECONDS
#
# Prints "version ..." and "ready", then reads lines "ID COMMAND [ARGS]".
# Each ID is one contender: a thread with its own redis.Redis client (its
# own connection pool); its commands run in order, on that thread (the Lock
# keeps its value thread-local). NAME is the full Redis key, without spaces.
# Commands and replies:
#
#   ID try NAME TTL_MS            Lock(client, NAME, timeout=TTL).acquire(blocking=False)
#                                 -> "ID granted VALUE" or "ID busy"
#   ID acquire NAME TTL_MS WAIT_MS
#                                 Lock(client, NAME, timeout=TTL, sleep=POLL)
#                                   .acquire(blocking_timeout=WAIT)
#                                 -> "ID granted VALUE" or "ID timeout"
#   ID release                    the held Lock's release() -> "ID released"
#   ID locked NAME                Lock(client, NAME).locked(): redis-py's view
#                                 -> "ID locked 1" (anyone holds) or "ID locked 0"
#   any failure                   -> "ID error TEXT"
#
# VALUE is the value redis-py stored in the key (its token). At the end of
# the input every contender releases what it holds, and the program exits.

import platform
import queue
import sys
import threading

# Debian's redis-py, also where another one is installed in
# /usr/local/lib/python3*/dist-packages (which comes first on sys.path).
sys.path.insert(0, "/usr/lib/python3/dist-packages")

import redis  # noqa: E402
from redis.lock import Lock  # noqa: E402

OUT = threading.Lock()


def say(ident, text):
    with OUT:
        sys.stdout.write(f"{ident} {text}\n")
        sys.stdout.flush()


def one_line(e):
    return " ".join(f"{type(e).__name__}: {e}".split())


class Contender:
    def __init__(self, ident, url, poll):
        self.ident = ident
        self.url = url
        self.poll = poll
        self.client = None
        self.held = None
        self.commands = queue.Queue()
        self.thread = threading.Thread(target=self.run, name=ident, daemon=True)
        self.thread.start()

    def lock(self, name, ttl_ms):
        return Lock(self.client, name, timeout=ttl_ms / 1000.0, sleep=self.poll)

    def granted(self, lock):
        self.held = lock
        say(self.ident, "granted " + lock.local.token.decode())

    def command(self, cmd):
        if cmd[0] == "try" and len(cmd) == 3 and self.held is None:
            lock = self.lock(cmd[1], int(cmd[2]))
            if lock.acquire(blocking=False):
                self.granted(lock)
            else:
                say(self.ident, "busy")
        elif cmd[0] == "acquire" and len(cmd) == 4 and self.held is None:
            lock = self.lock(cmd[1], int(cmd[2]))
            if lock.acquire(blocking=True, blocking_timeout=int(cmd[3]) / 1000.0):
                self.granted(lock)
            else:
                say(self.ident, "timeout")
        elif cmd == ["release"] and self.held is not None:
            lock, self.held = self.held, None
            lock.release()
            say(self.ident, "released")
        elif cmd[0] == "locked" and len(cmd) == 2:
            say(self.ident, "locked " + ("1" if Lock(self.client, cmd[1]).locked() else "0"))
        else:
            state = "holding" if self.held is not None else "holding nothing"
            say(self.ident, f"error unknown command {' '.join(cmd)!r} ({state})")

    def run(self):
        try:
            self.client = redis.Redis.from_url(
                self.url, socket_timeout=10, socket_connect_timeout=10
            )
        except Exception as e:  # noqa: BLE001 - every failure is a reply
            failure = one_line(e)
        else:
            failure = None
        while True:
            cmd = self.commands.get()
            if cmd is None:
                break
            if failure is not None:
                say(self.ident, "error " + failure)
                continue
            try:
                self.command(cmd)
            except Exception as e:  # noqa: BLE001
                say(self.ident, "error " + one_line(e))
        if self.held is not None:
            try:
                self.held.release()
            except Exception as e:  # noqa: BLE001
                sys.stderr.write(f"{self.ident}: release at exit: {one_line(e)}\n")
        if self.client is not None:
            self.client.close()


def main():
    if len(sys.argv) != 3:
        sys.stderr.write("usage: contender.py REDIS_URL POLL_SECONDS\n")
        sys.exit(2)
    url, poll = sys.argv[1], float(sys.argv[2])
    say("version", f"redis-py {redis.__version__} (python {platform.python_version()})")
    say("ready", "")
    contenders = {}
    while True:
        line = sys.stdin.readline()
        if not line:
            break
        fields = line.split()
        if len(fields) < 2:
            continue
        c = contenders.get(fields[0])
        if c is None:
            c = contenders[fields[0]] = Contender(fields[0], url, poll)
        c.commands.put(fields[1:])
    # End of input: each contender finishes its command (a blocking acquire
    # within its own bound), releases what it holds and closes its client.
    for c in contenders.values():
        c.commands.put(None)
    for c in contenders.values():
        c.thread.join(timeout=30)


if __name__ == "__main__":
    main()
