// A contender of etcd's own Go recipes, driven over stdin/stdout by
// dlock's interop tests (dlock_testkit::reference). It runs the recipes
// unchanged: concurrency.Mutex and contrib/recipes' RWMutex of the etcd
// release installed on the machine (Debian golang-etcd-server-dev, built
// offline in GOPATH mode).
//
// Usage: contender ENDPOINT[,ENDPOINT...] SESSION_TTL_SECONDS
//
// Prints "version ..." and "ready", then reads lines "ID COMMAND [ARGS]".
// Each ID is one contender with its own etcd client and session (lease);
// its commands run in order, one at a time. Commands and replies:
//
//	ID mutex PFX      concurrency.NewMutex(session, PFX).Lock
//	ID read PFX       recipe.NewRWMutex(session, PFX).RLock
//	ID write PFX      recipe.NewRWMutex(session, PFX).Lock
//	                  -> "ID behind KEY" each time the recipe's wait looks
//	                     and finds KEY in its way (it then watches KEY),
//	                     "ID granted CREATE_REVISION KEY" once it holds
//	ID release        -> "ID released"
//	ID holders mutex PFX   Go's view: the key concurrency.Mutex would let hold
//	ID holders rw PFX      Go's view: the keys RWMutex's rule lets hold
//	                  -> "ID holders [ROLE:KEY@CREATE_REVISION ...]"
//	any failure       -> "ID error TEXT"
//
// "behind" comes from a gRPC interceptor on the contender's own client: it
// reports the recipe's own range reads (those bounded by a revision, as
// its waits are), so the tests see where the recipe itself put us.
package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
	recipe "go.etcd.io/etcd/contrib/recipes"
	pb "go.etcd.io/etcd/etcdserver/etcdserverpb"
	"go.etcd.io/etcd/version"
	"google.golang.org/grpc"
)

var out sync.Mutex

func say(id, format string, args ...interface{}) {
	out.Lock()
	defer out.Unlock()
	fmt.Printf("%s %s\n", id, fmt.Sprintf(format, args...))
	os.Stdout.Sync()
}

type contender struct {
	id       string
	cmds     chan []string
	client   *clientv3.Client
	session  *concurrency.Session
	mu       sync.Mutex
	waiting  bool   // reports the recipe's looks while acquiring
	created  string // the key our last transaction created
	revision int64  // and its create revision
	unlock   func() error
}

func (c *contender) intercept(ctx context.Context, method string, req, reply interface{}, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err != nil {
		return err
	}
	c.mu.Lock()
	waiting := c.waiting
	c.mu.Unlock()
	if !waiting {
		return nil
	}
	switch r := req.(type) {
	case *pb.TxnRequest:
		resp, ok := reply.(*pb.TxnResponse)
		if ok && resp.Succeeded {
			for _, op := range r.Success {
				if put := op.GetRequestPut(); put != nil {
					c.mu.Lock()
					c.created, c.revision = string(put.Key), resp.Header.Revision
					c.mu.Unlock()
				}
			}
		}
	case *pb.RangeRequest:
		// The recipes' waits: Mutex's waitDeletes (max create revision),
		// RWMutex's waitOnLastRev (max mod revision).
		resp, ok := reply.(*pb.RangeResponse)
		if ok && (r.MaxCreateRevision > 0 || r.MaxModRevision > 0) && len(resp.Kvs) > 0 {
			say(c.id, "behind %s", resp.Kvs[0].Key)
		}
	}
	return nil
}

func (c *contender) acquire(kind, pfx string) {
	c.mu.Lock()
	c.waiting, c.created, c.revision = true, "", 0
	c.mu.Unlock()
	var err error
	switch kind {
	case "mutex":
		m := concurrency.NewMutex(c.session, pfx)
		err = m.Lock(context.Background())
		c.unlock = func() error { return m.Unlock(context.Background()) }
	case "read":
		rw := recipe.NewRWMutex(c.session, pfx)
		err = rw.RLock()
		c.unlock = rw.RUnlock
	case "write":
		rw := recipe.NewRWMutex(c.session, pfx)
		err = rw.Lock()
		c.unlock = rw.Unlock
	}
	c.mu.Lock()
	c.waiting = false
	key, rev := c.created, c.revision
	c.mu.Unlock()
	if err != nil {
		c.unlock = nil
		say(c.id, "error %v", err)
		return
	}
	say(c.id, "granted %d %s", rev, key)
}

// holders: which keys under PFX the recipe's own rule lets hold, asked
// with the recipe's own options.
func (c *contender) holders(kind, pfx string) {
	ctx := context.Background()
	var found []string
	if kind == "mutex" {
		resp, err := c.client.Get(ctx, pfx+"/", clientv3.WithFirstCreate()...)
		if err != nil {
			say(c.id, "error %v", err)
			return
		}
		for _, kv := range resp.Kvs {
			found = append(found, fmt.Sprintf("mutex:%s@%d", kv.Key, kv.CreateRevision))
		}
	} else {
		all, err := c.client.Get(ctx, pfx+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err != nil {
			say(c.id, "error %v", err)
			return
		}
		for _, kv := range all.Kvs {
			rest := strings.TrimPrefix(string(kv.Key), pfx+"/")
			role, blockers := "", ""
			switch {
			case strings.HasPrefix(rest, "read/"):
				role, blockers = "read", pfx+"/write"
			case strings.HasPrefix(rest, "write/"):
				role, blockers = "write", pfx+"/"
			default:
				continue
			}
			// RWMutex.waitOnLastRev, for a contender whose key has this
			// create revision.
			opts := append(clientv3.WithLastRev(), clientv3.WithMaxModRev(kv.CreateRevision-1))
			in, err := c.client.Get(ctx, blockers, opts...)
			if err != nil {
				say(c.id, "error %v", err)
				return
			}
			if len(in.Kvs) == 0 {
				found = append(found, fmt.Sprintf("%s:%s@%d", role, kv.Key, kv.CreateRevision))
			}
		}
	}
	sort.Strings(found)
	say(c.id, "holders %s", strings.Join(found, " "))
}

func (c *contender) run(endpoints []string, ttl int) {
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 10 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(c.intercept)},
	})
	var session *concurrency.Session
	if err == nil {
		session, err = concurrency.NewSession(client, concurrency.WithTTL(ttl))
	}
	c.mu.Lock()
	c.client, c.session = client, session
	c.mu.Unlock()
	for cmd := range c.cmds {
		if err != nil {
			say(c.id, "error %v", err)
			continue
		}
		switch {
		case len(cmd) == 2 && (cmd[0] == "mutex" || cmd[0] == "read" || cmd[0] == "write"):
			c.acquire(cmd[0], cmd[1])
		case len(cmd) == 1 && cmd[0] == "release" && c.unlock != nil:
			if uerr := c.unlock(); uerr != nil {
				say(c.id, "error %v", uerr)
			} else {
				say(c.id, "released")
			}
			c.unlock = nil
		case len(cmd) == 3 && cmd[0] == "holders":
			c.holders(cmd[1], cmd[2])
		default:
			say(c.id, "error unknown command %q", strings.Join(cmd, " "))
		}
	}
	c.close()
}

// close revokes the session's lease (its keys go) and closes the client (a
// recipe blocked on it returns).
func (c *contender) close() {
	c.mu.Lock()
	session, client := c.session, c.client
	c.session, c.client = nil, nil
	c.mu.Unlock()
	if session != nil {
		session.Close()
	}
	if client != nil {
		client.Close()
	}
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: contender ENDPOINTS SESSION_TTL_SECONDS")
		os.Exit(2)
	}
	endpoints := strings.Split(os.Args[1], ",")
	var ttl int
	fmt.Sscanf(os.Args[2], "%d", &ttl)
	say("version", "etcd-go %s (go.etcd.io/etcd/version, %s)", version.Version, runtime.Version())
	say("ready", "")
	contenders := map[string]*contender{}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		fields := strings.Fields(in.Text())
		if len(fields) < 2 {
			continue
		}
		c, ok := contenders[fields[0]]
		if !ok {
			c = &contender{id: fields[0], cmds: make(chan []string, 16)}
			contenders[fields[0]] = c
			go c.run(endpoints, ttl)
		}
		c.cmds <- fields[1:]
	}
	// stdin closed: every contender's session is closed (its keys go),
	// also under a contender still waiting in a recipe, then we exit.
	for _, c := range contenders {
		c.close()
	}
	os.Exit(0)
}
