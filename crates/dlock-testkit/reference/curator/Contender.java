// A contender of Apache Curator's recipes, driven over stdin/stdout by
// dlock's interop tests (dlock_testkit::reference). It runs the recipes
// unchanged: InterProcessMutex, InterProcessReadWriteLock and
// InterProcessSemaphoreV2 of the Curator installed on the machine (Debian
// libcurator-recipes-java), compiled by the tests with the machine's javac.
//
// Usage: java Contender CONNECT_STRING SESSION_TIMEOUT_MS
//
// Prints "version ..." and "ready", then reads lines "ID COMMAND [ARGS]".
// Each ID is one contender with its own CuratorFramework (its own
// ZooKeeper session); its commands run in order, on its own thread.
// Commands and replies:
//
//   ID mutex PATH        new InterProcessMutex(client, PATH).acquire()
//   ID read PATH         new InterProcessReadWriteLock(client, PATH).readLock().acquire()
//   ID write PATH        ... .writeLock().acquire()
//   ID sem PATH LIMIT    new InterProcessSemaphoreV2(client, PATH, LIMIT).acquire()
//                        -> "ID behind NODE" each time the recipe sets a
//                           watch on NODE to wait for it (NODE a name in
//                           the lock's directory, or "leases=N" when a
//                           semaphore waits with N leases in the way),
//                           "ID granted CZXID PATH" once it holds
//   ID release           -> "ID released"
//   ID holders mutex PATH      Curator's view: getParticipantNodes(), first
//   ID holders rw PATH         the read and write locks' participants, by
//                              Curator's rules (a writer first; readers
//                              before the first writer)
//   ID holders sem PATH LIMIT  the semaphore's getParticipantNodes() (every
//                              lease: Curator does not tell a waiter's apart)
//                        -> "ID holders [ROLE:PATH@CZXID ...]"
//   any failure          -> "ID error TEXT"
//
// "behind" and the granted node come from the contender's own ZooKeeper
// handle (a subclass Curator is given through its ZookeeperFactory), which
// sees the recipe's own requests: the sequential node it creates and the
// node it watches.

import java.io.BufferedReader;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryNTimes;
import org.apache.zookeeper.CreateMode;
import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.Watcher;
import org.apache.zookeeper.ZooKeeper;
import org.apache.zookeeper.data.ACL;
import org.apache.zookeeper.data.Stat;

public final class Contender {
    private static final Object OUT = new Object();

    static void say(String id, String text) {
        synchronized (OUT) {
            System.out.println(id + " " + text);
            System.out.flush();
        }
    }

    static String curatorVersion() {
        try (InputStream in = InterProcessMutex.class.getResourceAsStream(
                "/META-INF/maven/org.apache.curator/curator-recipes/pom.properties")) {
            Properties p = new Properties();
            p.load(in);
            return p.getProperty("version");
        } catch (Exception e) {
            return "unknown (" + e + ")";
        }
    }

    /** The contender's ZooKeeper handle: reports what the recipe does. */
    static final class Observed extends ZooKeeper {
        private final Worker worker;

        Observed(String connect, int timeout, Watcher watcher, boolean readOnly, Worker worker)
                throws java.io.IOException {
            super(connect, timeout, watcher, readOnly);
            this.worker = worker;
        }

        @Override
        public String create(String path, byte[] data, List<ACL> acl, CreateMode mode, Stat stat, long ttl)
                throws KeeperException, InterruptedException {
            Stat s = stat == null ? new Stat() : stat;
            String made = super.create(path, data, acl, mode, s, ttl);
            if (mode.isSequential()) {
                worker.created(made, s.getCzxid());
            }
            return made;
        }

        @Override
        public byte[] getData(String path, Watcher watcher, Stat stat)
                throws KeeperException, InterruptedException {
            byte[] data = super.getData(path, watcher, stat);
            if (watcher != null) {
                worker.watching(path);
            }
            return data;
        }

        @Override
        public List<String> getChildren(String path, Watcher watcher, Stat stat)
                throws KeeperException, InterruptedException {
            List<String> children = super.getChildren(path, watcher, stat);
            if (watcher != null) {
                worker.counted(path, children.size());
            }
            return children;
        }
    }

    static final class Worker implements Runnable {
        final String id;
        final String connect;
        final int sessionMs;
        final BlockingQueue<String[]> commands = new LinkedBlockingQueue<>();
        volatile CuratorFramework client;
        volatile String base = null; // the lock's directory while acquiring
        volatile int limit = 0;
        volatile String node = null; // our last sequential node there
        volatile long czxid = 0;
        AutoCloseable held = null;

        Worker(String id, String connect, int sessionMs) {
            this.id = id;
            this.connect = connect;
            this.sessionMs = sessionMs;
        }

        void created(String path, long zxid) {
            String b = base;
            if (b != null && path.startsWith(b + "/")) {
                node = path;
                czxid = zxid;
            }
        }

        void watching(String path) {
            String b = base;
            if (b != null && path.startsWith(b + "/")) {
                say(id, "behind " + path.substring(path.lastIndexOf('/') + 1));
            }
        }

        void counted(String path, int n) {
            String b = base;
            if (b != null && path.equals(b + "/leases") && n > limit) {
                say(id, "behind leases=" + n);
            }
        }

        long czxidOf(String path) throws Exception {
            Stat s = client.checkExists().forPath(path);
            return s == null ? -1 : s.getCzxid();
        }

        public void run() {
            try {
                client = CuratorFrameworkFactory.builder()
                        .connectString(connect)
                        .sessionTimeoutMs(sessionMs)
                        .connectionTimeoutMs(10000)
                        .retryPolicy(new RetryNTimes(3, 100))
                        .zookeeperFactory((c, t, w, ro) -> new Observed(c, t, w, ro, this))
                        .build();
                client.start();
                client.blockUntilConnected();
                for (;;) {
                    String[] cmd = commands.take();
                    if (cmd.length == 0) {
                        break;
                    }
                    try {
                        handle(cmd);
                    } catch (Exception e) {
                        say(id, "error " + e.toString().replace('\n', ' '));
                    }
                }
            } catch (Exception e) {
                say(id, "error " + e.toString().replace('\n', ' '));
            } finally {
                if (client != null) {
                    client.close(); // closes the session: its nodes go
                }
            }
        }

        void handle(String[] cmd) throws Exception {
            String what = cmd[0];
            if ((what.equals("mutex") || what.equals("read") || what.equals("write")) && cmd.length == 2) {
                base = cmd[1];
                InterProcessMutex m = what.equals("mutex") ? new InterProcessMutex(client, cmd[1])
                        : what.equals("read") ? new InterProcessReadWriteLock(client, cmd[1]).readLock()
                        : new InterProcessReadWriteLock(client, cmd[1]).writeLock();
                m.acquire();
                base = null;
                held = m::release;
                say(id, "granted " + czxid + " " + node);
            } else if (what.equals("sem") && cmd.length == 3) {
                base = cmd[1];
                limit = Integer.parseInt(cmd[2]);
                Lease lease = new InterProcessSemaphoreV2(client, cmd[1], limit).acquire();
                base = null;
                held = lease::close;
                // getNodeName() is the lease's name in the leases directory.
                String full = cmd[1] + "/leases/" + lease.getNodeName();
                say(id, "granted " + czxidOf(full) + " " + full);
            } else if (what.equals("release") && cmd.length == 1 && held != null) {
                AutoCloseable h = held;
                held = null;
                h.close();
                say(id, "released");
            } else if (what.equals("holders") && cmd.length >= 3) {
                List<String> found;
                try {
                    found = holders(cmd);
                } catch (KeeperException.NoNodeException e) {
                    found = new ArrayList<>(); // nothing there yet, or any more
                }
                say(id, "holders " + String.join(" ", found));
            } else {
                say(id, "error unknown command " + String.join(" ", cmd));
            }
        }

        List<String> holders(String[] cmd) throws Exception {
            List<String> found = new ArrayList<>();
            String path = cmd[2];
            switch (cmd[1]) {
                case "mutex": {
                    Collection<String> nodes = new InterProcessMutex(client, path).getParticipantNodes();
                    for (String n : nodes) {
                        found.add("mutex:" + n + "@" + czxidOf(n));
                        break;
                    }
                    break;
                }
                case "rw": {
                    InterProcessReadWriteLock rw = new InterProcessReadWriteLock(client, path);
                    List<String> all = new ArrayList<>(rw.readLock().getParticipantNodes());
                    all.addAll(rw.writeLock().getParticipantNodes());
                    all.sort((a, b) -> Long.compare(sequence(a), sequence(b)));
                    for (int i = 0; i < all.size(); i++) {
                        String n = all.get(i);
                        boolean writer = n.contains("__WRIT__");
                        if (writer) {
                            if (i == 0) {
                                found.add("write:" + n + "@" + czxidOf(n));
                            }
                            break;
                        }
                        found.add("read:" + n + "@" + czxidOf(n));
                    }
                    break;
                }
                case "sem": {
                    InterProcessSemaphoreV2 sem = new InterProcessSemaphoreV2(client, path, Integer.parseInt(cmd[3]));
                    for (String n : sem.getParticipantNodes()) {
                        String full = path + "/leases/" + n;
                        found.add("permit:" + full + "@" + czxidOf(full));
                    }
                    break;
                }
                default:
                    throw new IllegalArgumentException("no view " + cmd[1]);
            }
            return found;
        }

        static long sequence(String node) {
            return Long.parseLong(node.substring(node.length() - 10));
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: Contender CONNECT_STRING SESSION_TIMEOUT_MS");
            System.exit(2);
        }
        say("version", "curator " + curatorVersion() + " (zookeeper client "
                + org.apache.zookeeper.Version.getFullVersion().split("[-,]")[0] + ", java "
                + System.getProperty("java.version") + ")");
        say("ready", "");
        Map<String, Worker> workers = new HashMap<>();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] fields = line.trim().split("\\s+");
            if (fields.length < 2) {
                continue;
            }
            Worker w = workers.get(fields[0]);
            if (w == null) {
                w = new Worker(fields[0], args[0], Integer.parseInt(args[1]));
                workers.put(fields[0], w);
                Thread t = new Thread(w, "contender-" + fields[0]);
                t.setDaemon(true);
                t.start();
            }
            String[] cmd = new String[fields.length - 1];
            System.arraycopy(fields, 1, cmd, 0, cmd.length);
            w.commands.add(cmd);
        }
        // stdin closed: every contender's client is closed (its session
        // ends and its nodes go), also under a contender still waiting in
        // a recipe, then we exit.
        for (Worker w : workers.values()) {
            CuratorFramework c = w.client;
            if (c != null) {
                c.close();
            }
        }
        System.exit(0);
    }
}
