// Curator's peer in zklock's bench: InterProcessMutex on a real ZooKeeper, with zklock-bench's
// workloads and output line.
//
// Usage: java CuratorBench CONNECT WORKLOAD WORKERS CYCLES [KEYS]
//   uncontended | contended  WORKERS threads, one client (session) each, one key; CYCLES acquire + release each
//   keys                     the same on KEYS keys, each cycle on a random one
//   inproc                   WORKERS threads on one client, one key
//   drain                    WORKERS threads queue on one key behind a hold, which is then released;
//                            times the whole queue passing through
// Each worker connects and acquires once before the timed window opens. Prints one line:
//   peer=curator workload=W workers=N cycles=C secs=S ops_per_s=X p50_us=P p99_us=Q violations=V
//   (with more than one worker on one key, also holder_changes_per_s=H max_wait_us=M: how often
//   the lock changed hands, and the longest acquire)
//   peer=curator workload=drain waiters=N secs=S handoffs_per_s=X
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.ExponentialBackoffRetry;

public class CuratorBench {
    static final int WARM_UP_CYCLES = 200;

    public static void main(String[] args) throws Exception {
        if (args.length < 4) {
            System.err.println("usage: CuratorBench CONNECT uncontended|contended|keys|inproc|drain WORKERS CYCLES [KEYS]");
            System.exit(2);
        }
        String connect = args[0], workload = args[1];
        int workers = Integer.parseInt(args[2]), cycles = Integer.parseInt(args[3]);
        int keys = args.length > 4 ? Integer.parseInt(args[4]) : 1;
        String root = "/bench-curator-" + System.nanoTime();
        if (workload.equals("drain")) {
            drain(connect, root + "/drain", workers);
        } else {
            cycles(connect, root, workload, workers, cycles, workload.equals("keys") ? keys : 1);
        }
    }

    static CuratorFramework connect(String connect) throws InterruptedException {
        CuratorFramework client = CuratorFrameworkFactory.newClient(
            connect, 30_000, 15_000, new ExponentialBackoffRetry(100, 3));
        client.start();
        client.blockUntilConnected();
        return client;
    }

    static void cycles(String connect, String root, String workload, int workers, int cycles, int keys)
            throws Exception {
        int sessions = workload.equals("inproc") ? 1 : workers;
        List<CuratorFramework> clients = new ArrayList<>();
        for (int i = 0; i < sessions; i++) {
            clients.add(connect(connect));
        }
        InterProcessMutex warm = new InterProcessMutex(clients.get(0), root + "/warm");
        for (int i = 0; i < WARM_UP_CYCLES; i++) {
            warm.acquire();
            warm.release();
        }

        long[] latencies = new long[workers * cycles];
        AtomicInteger done = new AtomicInteger();
        AtomicInteger holders = new AtomicInteger();
        AtomicInteger violations = new AtomicInteger();
        AtomicInteger lastHolder = new AtomicInteger(-1);
        AtomicLong changes = new AtomicLong();
        AtomicLong maxWait = new AtomicLong();
        CountDownLatch ready = new CountDownLatch(workers);
        CountDownLatch go = new CountDownLatch(1);
        List<Thread> threads = new ArrayList<>();
        List<Throwable> failures = new ArrayList<>();
        for (int w = 0; w < workers; w++) {
            CuratorFramework client = clients.get(w % sessions);
            Random random = new Random(w);
            int me = w;
            Thread thread = new Thread(() -> {
                Map<Integer, InterProcessMutex> locks = new HashMap<>();
                try {
                    try {
                        // Untimed: the worker's first acquire (which creates the lock's path).
                        InterProcessMutex first =
                            locks.computeIfAbsent(me % keys, k -> new InterProcessMutex(client, root + "/k" + k));
                        first.acquire();
                        first.release();
                    } finally {
                        ready.countDown();
                    }
                    go.await();
                    long longest = 0;
                    for (int i = 0; i < cycles; i++) {
                        int key = keys > 1 ? random.nextInt(keys) : 0;
                        InterProcessMutex lock =
                            locks.computeIfAbsent(key, k -> new InterProcessMutex(client, root + "/k" + k));
                        long t0 = System.nanoTime();
                        lock.acquire();
                        longest = Math.max(longest, System.nanoTime() - t0);
                        // One key: nobody else may hold it now.
                        if (keys == 1 && holders.incrementAndGet() != 1) {
                            violations.incrementAndGet();
                        }
                        if (keys == 1 && lastHolder.getAndSet(me) != me) {
                            changes.incrementAndGet();
                        }
                        if (keys == 1) {
                            holders.decrementAndGet();
                        }
                        lock.release();
                        latencies[done.getAndIncrement()] = System.nanoTime() - t0;
                    }
                    long mine = longest;
                    maxWait.accumulateAndGet(mine, Math::max);
                } catch (Throwable e) {
                    synchronized (failures) {
                        failures.add(e);
                    }
                }
            });
            thread.start();
            threads.add(thread);
        }
        ready.await();
        long t0 = System.nanoTime();
        go.countDown();
        for (Thread thread : threads) {
            thread.join();
        }
        double secs = (System.nanoTime() - t0) / 1e9;
        if (!failures.isEmpty()) {
            throw new Exception("a worker failed", failures.get(0));
        }
        int n = done.get();
        long[] sorted = Arrays.copyOf(latencies, n);
        Arrays.sort(sorted);
        System.out.printf(
            "peer=curator workload=%s workers=%d cycles=%d secs=%.3f ops_per_s=%.1f p50_us=%d p99_us=%d violations=%d",
            workload, workers, n, secs, n / secs, sorted[n / 2] / 1000, sorted[(int) (n * 0.99)] / 1000,
            violations.get());
        if (keys == 1 && workers > 1) {
            System.out.printf(" holder_changes_per_s=%.1f max_wait_us=%d", changes.get() / secs, maxWait.get() / 1000);
        }
        System.out.println();
        for (CuratorFramework client : clients) {
            client.close();
        }
    }

    static void drain(String connect, String path, int waiters) throws Exception {
        try (CuratorFramework client = connect(connect)) {
            InterProcessMutex first = new InterProcessMutex(client, path);
            first.acquire();
            CountDownLatch passed = new CountDownLatch(waiters);
            for (int i = 0; i < waiters; i++) {
                new Thread(() -> {
                    try {
                        InterProcessMutex lock = new InterProcessMutex(client, path);
                        lock.acquire();
                        lock.release();
                    } catch (Exception e) {
                        e.printStackTrace();
                    }
                    passed.countDown();
                }).start();
            }
            // Every waiter's node is queued behind the holder's.
            while (client.getChildren().forPath(path).size() < waiters + 1) {
                Thread.sleep(20);
            }
            long t0 = System.nanoTime();
            first.release();
            passed.await();
            double secs = (System.nanoTime() - t0) / 1e9;
            System.out.printf("peer=curator workload=drain waiters=%d secs=%.3f handoffs_per_s=%.1f%n",
                waiters, secs, waiters / secs);
        }
    }
}
