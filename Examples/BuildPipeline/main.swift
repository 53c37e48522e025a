// The documents' operation features as a small build pipeline, on work items:
//
//   compile ──► lint (cancelled) ──► link ──► package
//        └──────────────────────────►┘
//
// - dependencies: `link` starts only when `compile` and `lint` are done, `package` when `link` is;
// - cancellation: `lint` is cancelled before it starts: its closure never runs, and a cancelled
//   dependency counts as done, so `link` still runs (and can tell, from `lint.state`);
// - priorities: the items carry QoS classes (`compile` user-initiated, `lint` utility);
// - observable state: every state change of every item is printed as it happens;
// - completion block: `package.notify(on: caller)` runs on the caller's queue when all is done.
//
// The items are started in reverse order on purpose: an item's dependencies are fixed when it is
// started, and the order of the `start` calls does not matter.

import GCD
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// One line of output at a time, from whichever thread reports.
let output = Mutex(())
func report(_ line: String) {
  output.withLock { _ in print(line) }
}

let workers = Queue(label: "build.workers", kind: .concurrent)
let caller = Queue(label: "build.caller")
let lintRan = Atomic<Bool>(false)
let done = try! Semaphore(value: 0)

let compile = WorkItem(qos: .userInitiated) { report("compile: compiling 3 sources") }
let lint = WorkItem(qos: .utility) {
  lintRan.store(true, ordering: .relaxed)
  report("lint: checking sources")
}
let link = WorkItem { report("link: linking (lint \(lint.state))") }
let package = WorkItem { report("package: writing build.tar") }

for (name, item) in [("compile", compile), ("lint", lint), ("link", link), ("package", package)] {
  item.onStateChange { state in report("state: \(name) -> \(state)") }
}

caller.sync {
  // The completion block, on the caller's queue.
  package.notify(on: caller) {
    report("completion: on the caller's queue: \(caller.isCurrent)")
    report(
      "summary: compile \(compile.state), lint \(lint.state), link \(link.state), package \(package.state);"
        + " lint ran: \(lintRan.load(ordering: .relaxed))")
    done.signal()
  }
  package.start(on: workers, after: [link])
  link.start(on: workers, after: [compile, lint])
  lint.start(on: workers, after: [compile])
  lint.cancel()
  compile.start(on: workers)
}

guard done.wait(timeout: .seconds(30)) else {
  report("the pipeline did not complete within 30 s")
  exit(1)
}
