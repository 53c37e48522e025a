import CDispatch
import Synchronization
import Testing

@testable import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// WorkItem: at most one execution whatever submits it, cancellation that
/// completes a pending item at once, notify / wait / `finished`,
/// dependencies in any order with cancelled and dropped dependencies
/// counted as done, observable state, flags and QoS reaching libdispatch,
/// safe drops in every state; `Queue.after`'s item; `asyncAndWait`;
/// the strict timer flag.
///
/// Results are read into locals before `#expect` (a failing expectation
/// reflects what it mentions).
@Suite("WorkItem")
struct WorkItemTests {
  // MARK: Dependencies

  /// The acceptance test: a diamond A → (B, C) → D, 10,000 times, started
  /// in dependency order and in reverse order, on a concurrent queue.
  @Test("a diamond of four items runs in dependency order 10,000 times, no item twice", .timeLimit(.minutes(2)))
  func diamond() {
    let queue = Queue(label: "workitem.diamond", kind: .concurrent)
    var failures: [String] = []
    for round in 0..<10_000 {
      let log = Recorder<Character>()
      let a = WorkItem { log.append("a") }
      let b = WorkItem { log.append("b") }
      let c = WorkItem { log.append("c") }
      let d = WorkItem { log.append("d") }
      if round.isMultiple(of: 2) {
        queue.async(a)
        b.start(on: queue, after: [a])
        c.start(on: queue, after: [a])
        d.start(on: queue, after: [b, c])
      } else {
        d.start(on: queue, after: [b, c])
        c.start(on: queue, after: [a])
        b.start(on: queue, after: [a])
        a.start(on: queue)
      }
      queue.async(a)  // a second submission runs nothing
      let done = d.wait(timeout: generousTimeout)
      let order = log.values
      let states = [a.state, b.state, c.state, d.state]
      let valid =
        done && order.count == 4 && Set(order) == ["a", "b", "c", "d"] && order.first == "a"
        && order.last == "d" && states.allSatisfy { $0 == .finished }
      if !valid {
        failures.append("round \(round): done \(done), order \(String(order)), states \(states)")
        if failures.count > 5 { break }
      }
    }
    #expect(failures.isEmpty, "\(failures)")
  }

  // On main this did not finish: each link's cycle check walked the whole pending chain behind it
  // and copied the path at every step (O(depth²) per link), so 20,000 links took hours; the scale
  // row work_item_graph found it (docs/performance.md, "Scale").
  @Test(
    "a pending chain of 20,000 items linked from its start, then a cycle closed on it, then run in order",
    .timeLimit(.minutes(1)))
  func longChainFromItsStart() async {
    let queue = Queue(label: "workitem.long-chain")
    let ran = Recorder<Int>()
    let root = WorkItem {}
    let chain = (0..<20_000).map { index in WorkItem { ran.append(index) } }
    for (index, item) in chain.enumerated() {
      item.start(on: queue, after: [index == 0 ? root : chain[index - 1]])
    }
    queue.async(root)
    let last = try? await chain[chain.count - 1].finished
    #expect(last == .finished)
    #expect(ran.values == Array(0..<20_000))
    // The walk still finds a cycle through the whole chain when there is one.
    let cycle = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let first = WorkItem {}
      let links = (0..<5_000).map { _ in WorkItem {} }
      for (index, item) in links.enumerated() {
        item.start(on: .global(), after: [index == 0 ? first : links[index - 1]])
      }
      first.start(on: .global(), after: [links[links.count - 1]])
    }
    #expect(standardError(of: cycle).contains("WorkItem.start(after:) would make a cycle"))
  }

  @Test("a cancelled dependency counts as done: the dependent runs and sees .cancelled")
  func cancelledDependencyReleasesDependents() {
    let queue = Queue(label: "workitem.cancelled-dependency")
    let dependencyRan = Event()
    let seen = Recorder<WorkItem.State>()
    let dependency = WorkItem { dependencyRan.signal() }
    let dependent = WorkItem { seen.append(dependency.state) }
    dependent.start(on: queue, after: [dependency])
    dependency.cancel()
    let finished = dependent.wait(timeout: generousTimeout)
    let states = seen.values
    #expect(finished)
    #expect(states == [.cancelled])
    #expect(!dependencyRan.isSignaled)
  }

  @Test("a dependency dropped before it ran counts as cancelled and lets the dependent run")
  func droppedDependencyReleasesDependents() {
    let queue = Queue(label: "workitem.dropped-dependency")
    let ran = Event()
    let dependent = WorkItem { ran.signal() }
    do {
      let dependency = WorkItem {}
      dependent.start(on: queue, after: [dependency])
    }
    let didRun = ran.wait()
    #expect(didRun)
  }

  @Test("a dependency already complete does not hold the dependent back")
  func completeDependency() {
    let queue = Queue(label: "workitem.complete-dependency")
    let first = WorkItem {}
    first.perform()
    let ran = Event()
    let second = WorkItem { ran.signal() }
    second.start(on: queue, after: [first])
    let didRun = ran.wait()
    #expect(didRun)
  }

  @Test("starting an item after itself, directly or through others, stops with a message")
  func cycleStops() async {
    let direct = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let item = WorkItem {}
      item.start(on: .global(), after: [item])
    }
    let directText = standardError(of: direct)
    #expect(directText.contains("WorkItem.start(after:) would make a cycle"), "\(directText)")
    let indirect = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let a = WorkItem {}
      let b = WorkItem {}
      let c = WorkItem {}
      a.start(on: .global(), after: [b])
      b.start(on: .global(), after: [c])
      c.start(on: .global(), after: [a])
    }
    let indirectText = standardError(of: indirect)
    #expect(indirectText.contains("WorkItem.start(after:) would make a cycle"), "\(indirectText)")
  }

  @Test("two starts that would close a cycle, on two threads at once: the second stops, naming the path")
  func racingCycleStops() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      // The cycle check walks the items that wait for the one being started, through their gates,
      // and the links are made under the same lock: one of the two starts comes second and sees the
      // other's link, however the threads interleave.
      let a = WorkItem {}
      let b = WorkItem {}
      let c = WorkItem {}
      b.start(on: .global(), after: [c])
      let ready = Atomic(0)
      let both = Group()
      for (item, dependency) in [(a, b), (c, a)] {
        both.async(on: Queue(label: "cycle.race")) {
          ready.add(1, ordering: .relaxed)
          while ready.load(ordering: .relaxed) < 2 {}
          item.start(on: .global(), after: [dependency])
        }
      }
      blocking { _ = both.wait(timeout: .seconds(30)) }
      exit(0)
    }
    let text = standardError(of: result)
    #expect(text.contains("WorkItem.start(after:) would make a cycle"), "\(text)")
    #expect(
      text.split(separator: " -> ", omittingEmptySubsequences: false).count == 3, "a path of three items: \(text)")
  }

  @Test("a chain of 10,000 items run to its end frees every item: the gates that held them are gone")
  func chainFreesItsItems() async throws {
    let freed = Counter()
    final class Tracked: Sendable {
      let freed: Counter
      init(_ freed: Counter) { self.freed = freed }
      deinit { freed.increment() }
    }
    let queue = Queue(label: "chain.free")
    do {
      var previous: WorkItem?
      var last: WorkItem?
      for _ in 0..<10_000 {
        let tracked = Tracked(freed)
        let item = WorkItem { withExtendedLifetime(tracked) {} }
        if let previous { item.start(on: queue, after: [previous]) }
        if last == nil { last = item }
        previous = item
      }
      let end = try #require(previous)
      queue.async(try #require(last))
      #expect(try await end.finished == .finished)
    }
    #expect(await eventually { freed.current == 10_000 }, "\(freed.current) of 10,000 closures freed")
  }

  // MARK: At most once

  @Test("perform twice runs the closure once; a later submission runs nothing")
  func performTwice() {
    let runs = Counter()
    let item = WorkItem { runs.increment() }
    item.perform()
    item.perform()
    let queue = Queue(label: "workitem.perform-twice")
    queue.async(item)
    queue.async(item)
    queue.sync {}
    let count = runs.current
    let state = item.state
    #expect(count == 1)
    #expect(state == .finished)
  }

  @Test("submitted to several queues many times at once, an item runs once")
  func submittedManyTimes() {
    let runs = Counter()
    let queues = (0..<4).map { Queue(label: "workitem.many-\($0)", kind: .concurrent) }
    for _ in 0..<200 {
      let item = WorkItem { runs.increment() }
      Queue.global().apply(8) { index in queues[index % 4].async(item) }
      let done = item.wait(timeout: generousTimeout)
      #expect(done)
    }
    for queue in queues { queue.syncBarrier {} }
    let count = runs.current
    #expect(count == 200)
  }

  @Test("an item submitted with flags (a fresh block per submission) still runs once")
  func blockSubmissionsRunOnce() {
    let runs = Counter()
    let queue = Queue(label: "workitem.block-once", kind: .concurrent)
    let item = WorkItem(flags: .enforceQoS, qos: .utility) { runs.increment() }
    for _ in 0..<10 { queue.async(item) }
    item.perform()
    queue.syncBarrier {}
    let count = runs.current
    #expect(count == 1)
  }

  // MARK: Cancellation

  @Test("cancel before start: the closure never runs, notify fires, wait returns, state is .cancelled")
  func cancelBeforeStart() {
    let ran = Event()
    let notified = Event()
    let queue = Queue(label: "workitem.cancel-before")
    let item = WorkItem { ran.signal() }
    item.notify(on: queue) { notified.signal() }
    item.cancel()
    let wasNotified = notified.wait()
    let waited = item.wait(timeout: generousTimeout)
    queue.async(item)
    item.perform()
    queue.sync {}
    let state = item.state
    let cancelled = item.isCancelled
    #expect(wasNotified)
    #expect(waited)
    #expect(!ran.isSignaled)
    #expect(state == .cancelled)
    #expect(cancelled)
  }

  @Test("cancelling an item that was never submitted completes it at once; notify after that runs too")
  func cancelNeverSubmitted() {
    let item = WorkItem {}
    item.cancel()
    item.wait()  // returns at once
    let notified = Event()
    item.notify(on: .global()) { notified.signal() }
    let wasNotified = notified.wait()
    #expect(wasNotified)
  }

  @Test("a submitted item cancelled before its queue reaches it never runs")
  func cancelSubmitted() {
    let queue = Queue(label: "workitem.cancel-submitted")
    let gate = Event()
    queue.async { gate.wait() }
    let ran = Event()
    let item = WorkItem { ran.signal() }
    queue.async(item)
    item.cancel()
    gate.signal()
    queue.sync {}
    let state = item.state
    #expect(!ran.isSignaled)
    #expect(state == .cancelled)
  }

  @Test("a running item that is cancelled finishes and sees isCancelled")
  func cancelWhileRunning() {
    let started = Event()
    let proceed = Event()
    let sawCancel = Mutex<Bool?>(nil)
    let holder = Mutex<WorkItem?>(nil)
    let item = WorkItem {
      started.signal()
      proceed.wait()
      sawCancel.withLock { $0 = holder.withLock { $0 }?.isCancelled }
    }
    holder.withLock { $0 = item }
    Queue.global().async(item)
    started.wait()
    item.cancel()
    let stateWhileRunning = item.state
    proceed.signal()
    item.wait()
    let saw = sawCancel.withLock { $0 }
    let state = item.state
    holder.withLock { $0 = nil }
    #expect(stateWhileRunning == .running)
    #expect(saw == true)
    #expect(state == .finished)
  }

  @Test("after(...) cancelled well before its deadline never runs; its closure is released at once")
  func afterCancelled() {
    let queue = Queue(label: "workitem.after-cancel")
    let ran = Event()
    let released = Event()
    let probe = DeinitProbe(released: released)
    let item = queue.after(.milliseconds(50)) { [probe] in
      _ = probe
      ran.signal()
    }
    _ = consume probe
    item.cancel()
    let wasReleased = released.wait()
    // A later timer on the same serial queue runs after the cancelled one's deadline.
    let marker = Event()
    queue.after(.milliseconds(100)) { marker.signal() }
    let markerRan = marker.wait()
    #expect(wasReleased)
    #expect(markerRan)
    #expect(!ran.isSignaled)
  }

  @Test("after(...) not cancelled runs, and its item finishes")
  func afterRuns() {
    let queue = Queue(label: "workitem.after-runs")
    let item = queue.after(.milliseconds(1)) {}
    let done = item.wait(timeout: generousTimeout)
    let state = item.state
    #expect(done)
    #expect(state == .finished)
  }

  @Test("after(deadline: .forever) never runs; the item stays pending until cancelled")
  func afterForever() {
    let item = Queue.global().after(deadline: .forever) {}
    let stateBefore = item.state
    let waited = item.wait(timeout: .milliseconds(20))
    item.cancel()
    let stateAfter = item.state
    #expect(stateBefore == .pending)
    #expect(!waited)
    #expect(stateAfter == .cancelled)
  }

  // MARK: Completion

  @Test("notify runs on the given queue after the closure; wait(timeout:) is false while pending")
  func notifyOnQueue() {
    let queue = Queue(label: "workitem.notify-target")
    let order = Recorder<String>()
    let onQueue = Mutex<Bool?>(nil)
    let notified = Event()
    let item = WorkItem { order.append("body") }
    item.notify(on: queue) {
      order.append("notify")
      onQueue.withLock { $0 = queue.isCurrent }
      notified.signal()
    }
    let early = item.wait(timeout: .milliseconds(10))
    Queue.global().async(item)
    let wasNotified = notified.wait()
    let recorded = order.values
    let isCurrent = onQueue.withLock { $0 }
    #expect(!early)
    #expect(wasNotified)
    #expect(recorded == ["body", "notify"])
    #expect(isCurrent == true)
  }

  @Test("every completion block runs once, after the closure: the first, later ones, and one added after a wait")
  func severalNotifies() {
    let order = Recorder<String>()
    let all = Latch(count: 4)
    let gate = Event()
    let item = WorkItem {
      gate.wait()
      order.append("body")
    }
    for index in 0..<3 {
      item.notify(on: Queue(label: "workitem.notify-\(index)")) {
        order.append("notify")
        all.signal()
      }
    }
    let early = item.wait(timeout: .milliseconds(1))
    item.notify(on: .global()) {
      order.append("notify")
      all.signal()
    }
    Queue.global().async(item)
    gate.signal()
    let allRan = all.wait()
    item.wait()
    let recorded = order.values
    #expect(!early)
    #expect(allRan)
    #expect(recorded == ["body", "notify", "notify", "notify", "notify"])
  }

  @Test("many threads can wait on one item, and wait again later")
  func manyWaiters() {
    let gate = Event()
    let item = WorkItem { gate.wait() }
    let waited = Counter()
    let all = Latch(count: 4)
    // Each waiter blocks a thread of its own: a serial queue's (an overcommit thread), not the
    // global pool's, which the item itself needs. Four blocked pool threads left the item to wait
    // for the pool to grow, and under ASan on a loaded two-core machine one waiter's 10 s ran out
    // first (CI: 3 of 4 waited).
    for index in 0..<4 {
      Queue(label: "workitem.waiter-\(index)").async {
        if item.wait(timeout: generousTimeout) { waited.increment() }
        all.signal()
      }
    }
    Queue(label: "workitem.many-waiters").async(item)
    gate.signal()
    let allDone = all.wait()
    item.wait()
    item.wait()
    let count = waited.current
    #expect(allDone)
    #expect(count == 4)
  }

  @Test("await item.finished returns the final state without blocking a thread")
  func awaitFinished() async throws {
    let item = WorkItem {}
    let cancelled = WorkItem {}
    Queue.global().after(.milliseconds(5), item)
    cancelled.cancel()
    let state = try await item.finished
    let cancelledState = try await cancelled.finished
    #expect(state == .finished)
    #expect(cancelledState == .cancelled)
  }

  @Test("a task waiting in item.finished throws CancellationError when cancelled; the item is untouched")
  func awaitFinishedCancelled() async {
    let item = WorkItem {}
    let task = Task { try await item.finished }
    task.cancel()
    let result = await task.result
    var threwCancellation = false
    if case .failure(let error) = result { threwCancellation = error is CancellationError }
    let state = item.state
    #expect(threwCancellation)
    #expect(state == .pending)
  }

  // MARK: Observing

  @Test("onStateChange sees running then finished; stateChanges yields pending, running, finished")
  func observeFinished() async {
    let seen = Recorder<WorkItem.State>()
    let item = WorkItem {}
    item.onStateChange { seen.append($0) }
    let stream = item.stateChanges
    Queue.global().async(item)
    var streamed: [WorkItem.State] = []
    for await state in stream { streamed.append(state) }
    let observed = seen.values
    #expect(streamed == [.pending, .running, .finished])
    #expect(observed == [.running, .finished])
  }

  @Test("observers of a cancelled item see .cancelled only; a stream of a complete item ends at once")
  func observeCancelled() async {
    let seen = Recorder<WorkItem.State>()
    let item = WorkItem {}
    item.onStateChange { seen.append($0) }
    let stream = item.stateChanges
    item.cancel()
    var streamed: [WorkItem.State] = []
    for await state in stream { streamed.append(state) }
    var late: [WorkItem.State] = []
    for await state in item.stateChanges { late.append(state) }
    let observed = seen.values
    #expect(observed == [.cancelled])
    #expect(streamed == [.pending, .cancelled])
    #expect(late == [.cancelled])
  }

  @Test("print and dump of an item show its state, not its closure")
  func reflection() {
    let item = WorkItem(flags: .barrier, qos: .utility) {}
    var dumped = ""
    dump(item, to: &dumped)
    let printed = "\(item)"
    #expect(printed == "WorkItem(pending, flags: [barrier], qos: 0x11/0)")
    #expect(dumped.contains("state: GCD.WorkItem.State.pending"), "\(dumped)")
  }

  // MARK: Flags and QoS

  /// A barrier item on a concurrent queue waits for the work before it and
  /// runs alone: checked through `dispatch_barrier_async_f` (a plain
  /// barrier) and through a block made with `DISPATCH_BLOCK_BARRIER` (a
  /// barrier with a QoS), submitted at once or after a delay.
  @Test(
    "a barrier item on a concurrent queue runs alone",
    arguments: [Queue.QoS.unspecified, .utility, .userInitiated], [false, true])
  func barrierRunsAlone(qos: Queue.QoS, delayed: Bool) {
    let queue = Queue(label: "workitem.barrier", kind: .concurrent)
    let release = Event()
    let meter = OverlapMeter()
    queue.async {
      meter.enter()
      release.wait()
      meter.exit()
    }
    let barrierRan = Event()
    let overlapInBarrier = Mutex<Int>(-1)
    let barrier = WorkItem(flags: .barrier, qos: qos) {
      overlapInBarrier.withLock { $0 = meter.enter() }
      letTimePass(.milliseconds(20))
      meter.exit()
      barrierRan.signal()
    }
    if delayed {
      queue.after(.milliseconds(1), barrier)
    } else {
      queue.async(barrier)
    }
    let after = Event()
    if !delayed {
      queue.async {
        meter.enter()
        meter.exit()
        after.signal()
      }
    } else {
      after.signal()
    }
    let ranWhileBlocked = barrierRan.wait(timeout: briefTimeout)
    release.signal()
    let ran = barrierRan.wait()
    let afterRan = after.wait()
    let overlap = overlapInBarrier.withLock { $0 }
    let maximum = meter.maximum
    #expect(!ranWhileBlocked)
    #expect(ran)
    #expect(afterRan)
    #expect(overlap == 1)
    #expect(maximum == 1)
  }

  @Test("every QoS class and relative priority is accepted, read back, and runs through its block")
  func qosClasses() {
    let classes: [Queue.QoS] = [.userInteractive, .userInitiated, .default, .utility, .background]
    let queue = Queue(label: "workitem.qos")
    for qos in classes {
      for relative: Int32 in [0, -7, -15] {
        let runs = Counter()
        let item = WorkItem(flags: [.enforceQoS], qos: qos.relative(relative)) { runs.increment() }
        queue.async(item)
        let done = item.wait(timeout: generousTimeout)
        let performed = WorkItem(qos: qos.relative(relative)) { runs.increment() }
        performed.perform()
        let count = runs.current
        let readBack = item.qos
        #expect(done)
        #expect(count == 2)
        #expect(readBack == qos.relative(relative))
      }
    }
  }

  @Test(
    "every flag is accepted by libdispatch and the item runs",
    arguments: [
      WorkItem.Flags.barrier, .detached, .assignCurrentContext, .noQoS, .inheritQoS, .enforceQoS,
    ])
  func eachFlag(flag: WorkItem.Flags) {
    let ran = Event()
    let item = WorkItem(flags: flag) { ran.signal() }
    Queue(label: "workitem.flag", kind: .concurrent).async(item)
    let didRun = ran.wait()
    #expect(didRun)
  }

  @Test("the flags are the DISPATCH_BLOCK_* values, the timer flag DISPATCH_TIMER_STRICT")
  func constants() {
    #expect(WorkItem.Flags.barrier.rawValue == UInt(DISPATCH_BLOCK_BARRIER))
    #expect(WorkItem.Flags.detached.rawValue == UInt(DISPATCH_BLOCK_DETACHED))
    #expect(WorkItem.Flags.assignCurrentContext.rawValue == UInt(DISPATCH_BLOCK_ASSIGN_CURRENT))
    #expect(WorkItem.Flags.noQoS.rawValue == UInt(DISPATCH_BLOCK_NO_QOS_CLASS))
    #expect(WorkItem.Flags.inheritQoS.rawValue == UInt(DISPATCH_BLOCK_INHERIT_QOS_CLASS))
    #expect(WorkItem.Flags.enforceQoS.rawValue == UInt(DISPATCH_BLOCK_ENFORCE_QOS_CLASS))
    #expect(TimerSource.Flags.strict.rawValue == UInt(DISPATCH_TIMER_STRICT))
  }

  @Test("an unknown flag or a QoS class libdispatch does not know stops with a message naming WorkItem")
  func invalidOptionsStop() async {
    let flag = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      _ = WorkItem(flags: WorkItem.Flags(rawValue: 0x40)) {}
    }
    let flagText = standardError(of: flag)
    #expect(flagText.contains("GCD: WorkItem(flags: [0x40])"), "\(flagText)")
    let unknownClass = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      _ = WorkItem(qos: Queue.QoS(rawClass: 0x42)) {}
    }
    let classText = standardError(of: unknownClass)
    #expect(classText.contains("GCD: WorkItem(qos: class 0x42"), "\(classText)")
    // A relative priority outside -15...0 cannot be made any more: `QoS` clamps it.
    #expect(Queue.QoS(rawClass: 0x19, relativePriority: -16).relativePriority == -15)
  }

  // MARK: Dropping

  /// Every state an item can be dropped in, in a child process (libdispatch
  /// traps on the release of a group in use): never submitted, never
  /// submitted with notify and waiters registered, cancelled, finished,
  /// dropped by the caller while submitted or running, waiting on a
  /// dependency, and `after` with its result ignored.
  @Test("dropping an item in every state is safe; a dropped unrun item notifies")
  func dropInEveryState() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      dropItemsInEveryState()
    }
    expectChildSaidOK(result)
  }

  // MARK: Queue additions

  @Test("asyncAndWait runs on the queue, after the work before it, and returns its result after")
  func asyncAndWait() {
    let queue = Queue(label: "workitem.async-and-wait")
    let order = Recorder<String>()
    let gate = Event()
    queue.async {
      gate.wait()
      order.append("before")
    }
    gate.signal()
    let (value, onQueue) = queue.asyncAndWait { () -> (Int, Bool) in
      order.append("work")
      return (42, queue.isCurrent)
    }
    order.append("returned")
    let recorded = order.values
    #expect(value == 42)
    #expect(onQueue)
    #expect(recorded == ["before", "work", "returned"])
  }

  @Test("asyncAndWait rethrows the closure's error")
  func asyncAndWaitThrows() {
    struct Failure: Error, Equatable {}
    let queue = Queue(label: "workitem.async-and-wait-throws")
    #expect(throws: Failure()) {
      try queue.asyncAndWait { () throws(Failure) -> Int in throw Failure() }
    }
  }

  @Test("asyncAndWaitBarrier on a concurrent queue runs alone")
  func asyncAndWaitBarrier() {
    let queue = Queue(label: "workitem.async-and-wait-barrier", kind: .concurrent)
    let meter = OverlapMeter()
    let release = Event()
    queue.async {
      meter.enter()
      release.wait()
      meter.exit()
    }
    Queue.global().after(.milliseconds(50)) { release.signal() }
    let overlap = queue.asyncAndWaitBarrier { () -> Int in
      let now = meter.enter()
      meter.exit()
      return now
    }
    let wasReleased = release.isSignaled
    #expect(overlap == 1)
    #expect(wasReleased)
  }

  @Test("asyncAndWait onto the queue the thread runs on stops with a message")
  func asyncAndWaitReentrant() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let queue = Queue(label: "workitem.reentrant")
      blocking { queue.sync { queue.asyncAndWait {} } }
    }
    let text = standardError(of: result)
    #expect(text.contains("Queue 'workitem.reentrant'.asyncAndWait would deadlock"), "\(text)")
  }

  // MARK: Strict timers

  @Test("TimerSource(queue:flags: .strict) creates a strict timer (mask 1) that fires")
  func strictTimer() {
    let timer = TimerSource(queue: Queue(label: "workitem.strict"), flags: .strict)
    let flags = timer.flags
    let mask = timer.mask
    let fired = Event()
    timer.setEventHandler { fired.signal() }
    timer.schedule(start: .now + .milliseconds(1))
    timer.resume()
    let didFire = fired.wait()
    timer.cancel()
    let plain = TimerSource(queue: .global()).flags
    #expect(flags == .strict)
    #expect(mask == 1)
    #expect(didFire)
    #expect(plain == [])
  }

  @Test("an unknown timer flag stops with a message")
  func unknownTimerFlag() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      _ = TimerSource(queue: .global(), flags: TimerSource.Flags(rawValue: 0x4))
    }
    let text = standardError(of: result)
    #expect(text.contains("GCD: TimerSource(flags: [0x4])"), "\(text)")
  }
}

/// The child of `dropInEveryState`: drops an item in each state.
private func dropItemsInEveryState() -> Never {
  let queue = Queue(label: "workitem.drop")
  do { _ = WorkItem {} }
  let notified = Event()
  do {
    let item = WorkItem { failChild("a dropped unrun item ran") }
    item.notify(on: queue) { notified.signal() }
    _ = item.wait(timeout: .milliseconds(1))
  }
  requireInChild(notified, "the notify of a dropped unrun item did not run")
  do {
    let item = WorkItem {}
    item.cancel()
  }
  do {
    let item = WorkItem {}
    item.perform()
    item.notify(on: queue) {}
  }
  let ran = Event()
  do { queue.async(WorkItem { ran.signal() }) }
  requireInChild(ran, "a submitted item dropped by its caller did not run")
  let started = Event()
  let proceed = Event()
  let finished = Event()
  do {
    let item = WorkItem {
      started.signal()
      proceed.wait()
    }
    item.notify(on: queue) { finished.signal() }
    Queue.global().async(item)
    requireInChild(started, "the item did not start")
  }
  proceed.signal()
  requireInChild(finished, "an item dropped while running did not finish")
  let dependentRan = Event()
  do {
    let dependency = WorkItem {}
    let dependent = WorkItem { dependentRan.signal() }
    dependent.start(on: queue, after: [dependency])
  }
  requireInChild(dependentRan, "an item whose dropped dependency was unrun did not run")
  let afterRan = Event()
  queue.after(.milliseconds(1)) { afterRan.signal() }
  requireInChild(afterRan, "after with its result ignored did not run")
  endChild("ok")
}

/// ExampleBuildPipeline, run as a program: its output's invariants.
@Suite("Example BuildPipeline")
struct BuildPipelineExampleTests {
  @Test("the pipeline runs in dependency order, the cancelled item never runs, completion on the caller's queue")
  func buildPipeline() async throws {
    let run = try await ExampleRun("BuildPipeline")
    let lines = run.output.split(separator: "\n").map(String.init)
    func index(_ line: String) -> Int { lines.firstIndex(of: line) ?? -1 }
    let order = [
      "state: compile -> running", "compile: compiling 3 sources", "state: compile -> finished",
      "state: link -> running", "link: linking (lint cancelled)", "state: link -> finished",
      "state: package -> running", "package: writing build.tar", "state: package -> finished",
      "completion: on the caller's queue: true",
      "summary: compile finished, lint cancelled, link finished, package finished; lint ran: false",
    ]
    let positions = order.map(index)
    let stateLines = lines.filter { $0.hasPrefix("state: ") }
    #expect(positions.allSatisfy { $0 >= 0 } && positions == positions.sorted(), "\(run.output)")
    #expect(lines.contains("state: lint -> cancelled"), "\(run.output)")
    #expect(!lines.contains { $0.hasPrefix("lint: ") }, "\(run.output)")
    #expect(stateLines.count == 7 && Set(stateLines).count == 7, "\(run.output)")
    #expect(lines.last == order.last, "\(run.output)")
  }
}
