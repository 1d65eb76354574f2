// Memory peer: Apache Curator's InterProcessMutex, for zklock-bench's mem-waiters and mem-keys probes.
// Usage: java -Xss256k -cp <curator jars>:. CuratorMem <connect> mem-waiters|mem-keys <n>
//   mem-waiters: <n> threads wait on one key behind a held lock (Curator's acquire blocks its thread).
//   mem-keys:    <n> distinct keys held by this process (acquired from a pool of 64 threads).
// Prints one line in zklock-bench's format:
//   peer=curator workload=W tasks=N secs=S rss_base_kb=B rss_kb=R peak_kb=P peak_per_task_kb=X
// rss_base_kb: VmRSS once connected and warmed up; rss_kb: VmRSS with every task queued or every key
// held; peak_kb: VmHWM (the process's peak resident set) at that moment.
import org.apache.curator.framework.*;
import org.apache.curator.framework.recipes.locks.*;
import org.apache.curator.retry.*;
import java.nio.file.*;
import java.util.*;
import java.util.concurrent.*;

public class CuratorMem {
    static long statusKb(String field) throws Exception {
        for (String line : Files.readAllLines(Paths.get("/proc/self/status"))) {
            if (line.startsWith(field + ":")) {
                return Long.parseLong(line.substring(field.length() + 1).trim().split("\\s+")[0]);
            }
        }
        return 0;
    }

    public static void main(String[] a) throws Exception {
        String connect = a[0], workload = a[1];
        int n = Integer.parseInt(a[2]);
        CuratorFramework c = CuratorFrameworkFactory.newClient(connect, 30000, 15000, new ExponentialBackoffRetry(100, 3));
        c.start();
        c.blockUntilConnected();
        String root = "/bench-curator-mem-" + System.nanoTime();
        InterProcessMutex warm = new InterProcessMutex(c, root + "/warm");
        for (int i = 0; i < 200; i++) { warm.acquire(); warm.release(); }
        System.gc();
        long base = statusKb("VmRSS");
        long t0 = System.nanoTime();
        if (workload.equals("mem-waiters")) {
            String path = root + "/k0";
            InterProcessMutex first = new InterProcessMutex(c, path);
            first.acquire();
            for (int i = 0; i < n; i++) {
                Thread t = new Thread(() -> {
                    try { InterProcessMutex m = new InterProcessMutex(c, path); m.acquire(); m.release(); }
                    catch (Exception e) { /* the session closes under the waiters at exit */ }
                });
                t.setDaemon(true);
                t.start();
            }
            while (c.getChildren().forPath(path).size() < n + 1) Thread.sleep(50);
        } else if (workload.equals("mem-keys")) {
            List<InterProcessMutex> held = Collections.synchronizedList(new ArrayList<>());
            ExecutorService pool = Executors.newFixedThreadPool(64);
            List<Future<?>> fs = new ArrayList<>();
            for (int i = 0; i < n; i++) {
                final int k = i;
                fs.add(pool.submit(() -> {
                    InterProcessMutex m = new InterProcessMutex(c, root + "/m" + k);
                    m.acquire();
                    held.add(m);
                    return null;
                }));
            }
            for (Future<?> f : fs) f.get();
            pool.shutdown();
        } else {
            throw new IllegalArgumentException("workload: mem-waiters | mem-keys");
        }
        double secs = (System.nanoTime() - t0) / 1e9;
        long rss = statusKb("VmRSS"), peak = statusKb("VmHWM");
        System.out.printf("peer=curator workload=%s tasks=%d secs=%.3f rss_base_kb=%d rss_kb=%d peak_kb=%d peak_per_task_kb=%.2f%n",
            workload, n, secs, base, rss, peak, (peak - base) / (double) n);
        System.out.flush();
        c.close(); // the server deletes this session's nodes
        System.exit(0);
    }
}
