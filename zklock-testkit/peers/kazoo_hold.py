"""kazoo's peer in zklock's interoperability tests: kazoo's Lock, ReadLock and WriteLock on a real
ZooKeeper, driven line by line over stdin, telling on stdout what happened and when.

Usage: kazoo_hold.py CONNECT [SESSION_SECS]   (one kazoo client, one session of SESSION_SECS,
       default 10, for the whole run)

Commands, one a line on stdin:
  acquire NAME KIND PATH [PATTERNS]  a new kazoo lock object NAME of KIND (lock | read | write) on
                                     PATH, acquired in a thread of its own (blocking, no timeout);
                                     PATTERNS is a comma-separated extra_lock_patterns (kazoo 2.7.1+)
  release NAME                       releases NAME
  quit                               closes the client and exits
Lines printed (each flushed at once):
  ready                              the client is connected
  acquired NAME EPOCH_MS             NAME was granted
  released NAME EPOCH_MS             NAME was released (the time is taken before the delete)
  error NAME MESSAGE                 a command on NAME failed
"""

import sys
import threading
import time

from kazoo.client import KazooClient

out_lock = threading.Lock()


def say(*words):
    with out_lock:
        sys.stdout.write(" ".join(str(w) for w in words) + "\n")
        sys.stdout.flush()


def now_ms():
    return time.time_ns() // 1_000_000


def make_lock(client, kind, path, patterns):
    recipes = {"lock": client.Lock, "read": client.ReadLock, "write": client.WriteLock}
    if kind not in recipes:
        raise ValueError("unknown kind %r (lock, read or write)" % kind)
    return recipes[kind](path, "kazoo-peer", extra_lock_patterns=patterns)


def acquire(name, lock):
    try:
        lock.acquire()
        say("acquired", name, now_ms())
    except Exception as err:  # reported to the test, which decides
        say("error", name, repr(err).replace("\n", " "))


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: kazoo_hold.py CONNECT [SESSION_SECS]")
    session = float(sys.argv[2]) if len(sys.argv) == 3 else 10.0
    client = KazooClient(hosts=sys.argv[1], timeout=session)
    client.start(timeout=60)
    say("ready")
    locks = {}
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        command, args = words[0], words[1:]
        if command == "quit":
            break
        name = args[0] if args else "-"
        try:
            if command == "acquire":
                kind, path = args[1], args[2]
                patterns = tuple(p for p in (args[3] if len(args) > 3 else "").split(",") if p)
                locks[name] = make_lock(client, kind, path, patterns)
                threading.Thread(target=acquire, args=(name, locks[name]), daemon=True).start()
            elif command == "release":
                at = now_ms()
                locks.pop(name).release()
                say("released", name, at)
            else:
                say("error", name, "unknown command %r" % command)
        except Exception as err:
            say("error", name, repr(err).replace("\n", " "))
    client.stop()
    client.close()


if __name__ == "__main__":
    main()
