import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

@Suite("Group")
struct GroupTests {
  @Test("wait() returns once every async item has run")
  func waitForAll() {
    let group = Group()
    let queue = Queue(label: "group.work", kind: .concurrent)
    let finished = Counter()
    for _ in 0..<1_000 {
      group.async(on: queue) { finished.increment() }
    }
    group.wait()
    #expect(finished.current == 1_000)
  }

  @Test("notify runs after all work on several queues, exactly once")
  func notifyAfterAll() {
    let group = Group()
    let queues = [Queue(label: "g.serial"), Queue(label: "g.concurrent", kind: .concurrent), Queue.global(.low)]
    let finished = Counter()
    let seenAtNotify = Mutex<[Int]>([])
    let notified = Event()
    for index in 0..<300 {
      group.async(on: queues[index % 3]) { finished.increment() }
    }
    group.notify(on: Queue(label: "g.notify")) {
      seenAtNotify.withLock { $0.append(finished.current) }
      notified.signal()
    }
    #expect(notified.wait())
    #expect(seenAtNotify.withLock { $0 } == [300])
  }

  @Test("notify waits for a manual enter() until its leave()")
  func notifyWaitsForLeave() {
    let group = Group()
    let notified = Event()
    group.enter()
    group.notify(on: Queue.global()) { notified.signal() }
    #expect(!notified.wait(timeout: briefTimeout))
    group.leave()
    #expect(notified.wait())
  }

  @Test("notify on an empty group runs at once")
  func notifyEmpty() {
    let notified = Event()
    Group().notify(on: Queue(label: "g.empty")) { notified.signal() }
    #expect(notified.wait())
  }

  @Test("notify runs on the queue it was given")
  func notifyOnQueue() {
    let queue = Queue(label: "g.notify.queue")
    let group = Group()
    let onQueue = Mutex(false)
    let notified = Event()
    group.async(on: Queue.global()) {}
    group.notify(on: queue) {
      onQueue.withLock { $0 = queue.isCurrent }
      notified.signal()
    }
    #expect(notified.wait())
    #expect(onQueue.withLock { $0 })
  }

  @Test("wait(timeout:) is false while an enter() is pending and true after its leave()")
  func waitTimeout() {
    let group = Group()
    #expect(group.wait(timeout: .zero))
    group.enter()
    #expect(!group.wait(timeout: .milliseconds(20)))
    #expect(!group.wait(timeout: .zero))
    #expect(!group.wait(timeout: .seconds(-1)))
    group.leave()
    #expect(group.wait(timeout: .zero))
    #expect(group.wait(timeout: generousTimeout))
  }

  @Test("wait(timeout:) returns true as soon as work finishes on another thread")
  func waitTimeoutWakes() {
    let group = Group()
    let release = Event()
    group.async(on: Queue(label: "g.blocker")) { release.wait() }
    #expect(!group.wait(timeout: .milliseconds(20)))
    release.signal()
    #expect(group.wait(timeout: generousTimeout))
  }

  @Test("wait(timeout:) with a huge timeout clamps instead of trapping")
  func waitHugeTimeout() {
    let group = Group()
    #expect(group.wait(timeout: .seconds(Int64.max)))
    group.async(on: Queue.global()) {}
    #expect(group.wait(timeout: .seconds(Int64.max)))
  }

  @Test("wait(deadline:) with monotonic, wall-clock, past and forever deadlines")
  func waitDeadline() {
    let group = Group()
    #expect(group.wait(deadline: .now))
    group.enter()
    #expect(!group.wait(deadline: .now + .milliseconds(20)))
    #expect(!group.wait(deadline: .wallClock() + .milliseconds(20)))
    #expect(!group.wait(deadline: .now - .seconds(1)))
    Queue.global().after(.milliseconds(10)) { group.leave() }
    #expect(group.wait(deadline: .forever))
    #expect(group.wait(deadline: .wallClock()))
  }

  @Test("a group can be reused after it has emptied")
  func reuse() {
    let group = Group()
    let queue = Queue(label: "g.reuse")
    for round in 1...3 {
      let finished = Counter()
      for _ in 0..<10 { group.async(on: queue) { finished.increment() } }
      group.wait()
      #expect(finished.current == 10, "round \(round)")
    }
  }

  @Test("enter/leave balanced from many threads leave the group empty")
  func balancedEnterLeave() {
    let group = Group()
    Queue.global().apply(1_000) { _ in
      group.enter()
      group.leave()
    }
    #expect(group.wait(timeout: .zero))
  }

  @Test("the group lives while its async work is pending, even when the caller drops it")
  func groupKeptAliveByWork() {
    let release = Event()
    let notified = Event()
    do {
      let group = Group()
      group.async(on: Queue(label: "g.alive")) { release.wait() }
      group.notify(on: Queue.global()) { notified.signal() }
    }
    #expect(!notified.wait(timeout: briefTimeout))
    release.signal()
    #expect(notified.wait())
  }

  // MARK: - C-function forms

  @Test("async(on:context:function:) counts the function in the group")
  func asyncFunction() {
    let group = Group()
    let call = FunctionCall()
    group.async(on: Queue(label: "g.f"), context: call.pointer, function: recordCall)
    group.wait()
    #expect(call.count.current == 1)
  }

  @Test("notify(on:context:function:) calls the function once the group is done")
  func notifyFunction() {
    let group = Group()
    let call = FunctionCall()
    group.enter()
    group.notify(on: Queue.global(), context: call.pointer, function: recordCall)
    #expect(!call.done.wait(timeout: briefTimeout))
    group.leave()
    #expect(call.done.wait())
    #expect(call.count.current == 1)
  }

  // MARK: - Dropping a group in an awkward state

  @Test("dropping a group with unmatched enters does not trap, and its pending notify runs")
  func dropWithUnmatchedEnters() {
    let notified = Event()
    do {
      let group = Group()
      group.enter()
      group.enter()
      group.notify(on: Queue.global()) { notified.signal() }
    }
    #expect(notified.wait())
  }

  @Test("dropping a group with unmatched enters is safe in a child process too (a trap fails only this test)")
  func dropWithUnmatchedEntersExit() async {
    await #expect(processExitsWith: .success) {
      dropGroupWithUnmatchedEnters()
    }
  }

  // Regression: `deinit` balances whatever is still counted, assuming that
  // pending work holds the wrapper. Functions submitted with
  // async(on:context:function:) used to go through dispatch_group_async_f,
  // which does not: deinit left for them too, and when the function
  // finished libdispatch's own leave crashed the process.
  @Test("dropping a group while an async(on:context:function:) item is pending is safe")
  func dropWithPendingFunction() async {
    await #expect(processExitsWith: .success) {
      dropGroupWithPendingFunction()
    }
  }

  // MARK: - Misuse

  @Test("leave() without enter() stops the process (with a message in debug builds)")
  func unbalancedLeave() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      Group().leave()
    }
    #if DEBUG
      #expect(standardError(of: result).contains("GCD: Group.leave() without a matching enter()"))
    #endif
  }

  @Test("one leave() too many after balanced enter/leave stops the process with a message in debug builds")
  func oneLeaveTooMany() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let group = Group()
      group.enter()
      group.leave()
      group.leave()
    }
    #if DEBUG
      #expect(standardError(of: result).contains("GCD: Group.leave() without a matching enter()"))
    #endif
  }

  // Regression: Group.async(on:) used to count its enter() in the debug
  // balance but leave with dispatch_group_leave directly, so after N async
  // items N stray leave()s passed the debug check and reached libdispatch's
  // bare trap.
  @Test("leave() without enter() after async work has finished stops with the debug message")
  func unbalancedLeaveAfterAsync() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      leaveAfterAsyncWork()
    }
    #if DEBUG
      #expect(standardError(of: result).contains("GCD: Group.leave() without a matching enter()"))
    #endif
  }
}

// MARK: - Exit-test bodies that block (exit-test closures are async)

private func dropGroupWithUnmatchedEnters() {
  let notified = Event()
  do {
    let group = Group()
    for _ in 0..<5 { group.enter() }
    group.async(on: Queue.global()) {}
    group.notify(on: Queue(label: "g.dropped.notify")) { notified.signal() }
  }
  requireInChild(notified, "the notify of a group dropped with unmatched enters did not run")
}

private func blockOnEvent(_ context: UnsafeMutableRawPointer?) {
  Unmanaged<Event>.fromOpaque(context!).takeUnretainedValue().wait()
}

private func dropGroupWithPendingFunction() {
  let release = Event()
  let queue = Queue(label: "g.pending.f")
  do {
    let group = Group()
    group.async(on: queue, context: Unmanaged.passUnretained(release).toOpaque(), function: blockOnEvent)
  }
  release.signal()
  // The function has finished (and left the group) once the queue is idle.
  queue.sync {}
  let settled = Event()
  Queue.global().after(.milliseconds(50)) { settled.signal() }
  requireInChild(settled, "the process did not settle")
}

private func leaveAfterAsyncWork() {
  let group = Group()
  group.async(on: Queue.global()) {}
  group.wait()
  group.leave()
}
