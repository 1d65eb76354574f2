// One Apache Curator client that takes a lock, holds it, releases it, and says when: the other side
// of zklock's interoperability tests (zklock-testkit's CuratorHold runs it through `run curator-hold`).
//
// Usage: java CuratorHold CONNECT PATH MODE HOLD_MS [COUNT]
//   MODE: mutex          InterProcessMutex
//         read | write   InterProcessReadWriteLock's read or write lock
//         semaphore:N    a lease of InterProcessSemaphoreV2 with N leases
//         latch[:ID]     LeaderLatch with participant id ID (default "curator"): held while it leads
//         selector[:ID]  LeaderSelector with participant id ID (default "curator"): held while
//                        takeLeadership runs
// For each of COUNT rounds (default 1) it prints "acquired <epoch_ms>" once it holds, sleeps HOLD_MS,
// prints "released <epoch_ms>" and lets go, so the release itself comes right after that line.
import java.util.concurrent.CountDownLatch;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderSelector;
import org.apache.curator.framework.recipes.leader.LeaderSelectorListenerAdapter;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.ExponentialBackoffRetry;

public class CuratorHold {
    static final String MODES = "mutex | read | write | semaphore:N | latch[:ID] | selector[:ID]";

    public static void main(String[] args) throws Exception {
        if (args.length < 4) {
            System.err.println("usage: CuratorHold CONNECT PATH " + MODES + " HOLD_MS [COUNT]");
            System.exit(2);
        }
        String connect = args[0], path = args[1], mode = args[2];
        long holdMs = Long.parseLong(args[3]);
        int rounds = args.length > 4 ? Integer.parseInt(args[4]) : 1;
        try (CuratorFramework client = CuratorFrameworkFactory.newClient(
                connect, 30_000, 15_000, new ExponentialBackoffRetry(100, 3))) {
            client.start();
            client.blockUntilConnected();
            for (int round = 0; round < rounds; round++) {
                holdOnce(client, path, mode, holdMs);
            }
        }
    }

    static void holdOnce(CuratorFramework client, String path, String mode, long holdMs) throws Exception {
        if (mode.startsWith("semaphore:")) {
            int leases = Integer.parseInt(mode.substring("semaphore:".length()));
            InterProcessSemaphoreV2 semaphore = new InterProcessSemaphoreV2(client, path, leases);
            Lease lease = semaphore.acquire();
            hold(holdMs);
            semaphore.returnLease(lease);
        } else if (mode.equals("latch") || mode.startsWith("latch:")) {
            LeaderLatch latch = new LeaderLatch(client, path, participant(mode));
            latch.start();
            latch.await();
            hold(holdMs);
            latch.close();
        } else if (mode.equals("selector") || mode.startsWith("selector:")) {
            CountDownLatch done = new CountDownLatch(1);
            LeaderSelector selector = new LeaderSelector(client, path, new LeaderSelectorListenerAdapter() {
                @Override
                public void takeLeadership(CuratorFramework c) throws Exception {
                    try {
                        hold(holdMs);
                    } finally {
                        done.countDown();
                    }
                    // Returning gives the leadership up.
                }
            });
            selector.setId(participant(mode));
            selector.start();
            done.await();
            selector.close();
        } else {
            InterProcessMutex lock;
            switch (mode) {
                case "mutex": lock = new InterProcessMutex(client, path); break;
                case "read": lock = new InterProcessReadWriteLock(client, path).readLock(); break;
                case "write": lock = new InterProcessReadWriteLock(client, path).writeLock(); break;
                default: throw new IllegalArgumentException("MODE is one of: " + MODES + "; not " + mode);
            }
            lock.acquire();
            hold(holdMs);
            lock.release();
        }
    }

    /** The participant id of `latch:ID` or `selector:ID`; "curator" without one. */
    static String participant(String mode) {
        int colon = mode.indexOf(':');
        return colon < 0 ? "curator" : mode.substring(colon + 1);
    }

    /** Says "acquired", holds for holdMs, says "released"; the caller lets go right after. */
    static void hold(long holdMs) throws InterruptedException {
        say("acquired");
        Thread.sleep(holdMs);
        say("released");
    }

    static void say(String event) {
        System.out.println(event + " " + System.currentTimeMillis());
        System.out.flush();
    }
}
