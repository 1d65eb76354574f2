"""kazoo's peer in zklock's bench: kazoo's Lock on a real ZooKeeper, with zklock-bench's workloads and
output line.

Usage: kazoo_bench.py CONNECT WORKLOAD WORKERS CYCLES [KEYS]
  uncontended | contended   WORKERS threads, one client (session) each, one key
  keys                      the same on KEYS keys, each cycle on a random one
Each worker connects and acquires once before the timed window opens. Prints one line:
  peer=kazoo workload=W workers=N cycles=C secs=S ops_per_s=X p50_us=P p99_us=Q
  (with more than one worker on one key, also holder_changes_per_s=H max_wait_us=M: how often the
  lock changed hands, and the longest acquire)
"""

import random
import sys
import threading
import time

from kazoo.client import KazooClient

WARM_UP_CYCLES = 100


def main():
    if len(sys.argv) < 5:
        sys.exit("usage: kazoo_bench.py CONNECT uncontended|contended|keys WORKERS CYCLES [KEYS]")
    connect, workload = sys.argv[1], sys.argv[2]
    workers, cycles = int(sys.argv[3]), int(sys.argv[4])
    keys = int(sys.argv[5]) if len(sys.argv) > 5 and workload == "keys" else 1
    root = "/bench-kazoo-%d" % time.time_ns()

    clients = [KazooClient(hosts=connect, timeout=30) for _ in range(workers)]
    for client in clients:
        client.start()
    warm = clients[0].Lock(root + "/warm")
    for _ in range(WARM_UP_CYCLES):
        warm.acquire()
        warm.release()

    latencies, latencies_lock = [], threading.Lock()
    # [holder changes, longest wait in ns] over every worker; the last holder of the one key.
    fairness = [0, 0]
    last_holder = [None]
    holder_lock = threading.Lock()
    ready = threading.Barrier(workers + 1)
    go = threading.Event()

    def lock_of(locks, worker, key):
        if key not in locks:
            locks[key] = clients[worker].Lock("%s/k%d" % (root, key))
        return locks[key]

    def work(worker):
        rng = random.Random(worker)
        locks = {}
        mine = []
        changes, longest = 0, 0
        try:
            # Untimed: the worker's first acquire (which creates the lock's path).
            first = lock_of(locks, worker, worker % keys)
            first.acquire()
            first.release()
        finally:
            ready.wait()
        go.wait()
        for _ in range(cycles):
            key = rng.randrange(keys) if keys > 1 else 0
            lock = lock_of(locks, worker, key)
            t0 = time.perf_counter_ns()
            lock.acquire()
            longest = max(longest, time.perf_counter_ns() - t0)
            if keys == 1:
                with holder_lock:
                    if last_holder[0] != worker:
                        changes += 1
                    last_holder[0] = worker
            lock.release()
            mine.append(time.perf_counter_ns() - t0)
        with latencies_lock:
            latencies.extend(mine)
            fairness[0] += changes
            fairness[1] = max(fairness[1], longest)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for thread in threads:
        thread.start()
    ready.wait()
    t0 = time.perf_counter()
    go.set()
    for thread in threads:
        thread.join()
    secs = time.perf_counter() - t0

    latencies.sort()
    n = len(latencies)
    line = "peer=kazoo workload=%s workers=%d cycles=%d secs=%.3f ops_per_s=%.1f p50_us=%d p99_us=%d" % (
        workload, workers, n, secs, n / secs, latencies[n // 2] // 1000, latencies[int(n * 0.99)] // 1000)
    if keys == 1 and workers > 1:
        line += " holder_changes_per_s=%.1f max_wait_us=%d" % (fairness[0] / secs, fairness[1] // 1000)
    print(line)
    for client in clients:
        client.stop()
        client.close()


if __name__ == "__main__":
    main()
