import CGCD
import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

@Suite("Queue")
struct QueueTests {
  struct Failure: Error, Equatable {
    let code: Int
  }

  // MARK: - Creation, labels, kinds, QoS

  @Test("the label given at creation is read back, including an empty and a non-ASCII one")
  func labels() {
    #expect(Queue(label: "com.example.worker").label == "com.example.worker")
    #expect(Queue(label: "").label == "")
    #expect(Queue(label: "Warteschlange ✓ 队列").label == "Warteschlange ✓ 队列")
    #expect(Queue(label: "c", kind: .concurrent).label == "c")
  }

  @Test("kind is what the queue was created with; created queues are not global")
  func kinds() {
    let serial = Queue(label: "serial")
    let concurrent = Queue(label: "concurrent", kind: .concurrent)
    #expect(serial.kind == .serial)
    #expect(concurrent.kind == .concurrent)
    #expect(!serial.isGlobal)
    #expect(!concurrent.isGlobal)
    #expect(serial.isActive)
  }

  static let qosClasses: [Queue.QoS] = [.userInitiated, .default, .utility, .background]

  @Test("qos reads back the class and relative priority the queue was created with", arguments: qosClasses)
  func qosRoundTrip(qos: Queue.QoS) {
    for relative: Int32 in [0, -1, -15] {
      let wanted = qos.relative(relative)
      #expect(Queue(label: "qos", qos: wanted).qos == wanted)
      #expect(Queue(label: "qos.concurrent", kind: .concurrent, qos: wanted).qos == wanted)
      #expect(Queue(label: "qos.inactive", qos: wanted, initiallyInactive: true).qos == wanted)
    }
  }

  // libdispatch on Linux records user-interactive as user-initiated; `qos` documents it.
  @Test("qos: libdispatch on Linux records user-interactive as user-initiated (documented)")
  func qosUserInteractiveRoundTrip() {
    let queue = Queue(label: "qos.interactive", qos: .userInteractive)
    #expect(queue.qos == .userInitiated)
  }

  @Test("a queue created without a QoS reports unspecified")
  func qosUnspecified() {
    #expect(Queue(label: "plain").qos == .unspecified)
  }

  @Test("relative priorities clamp to -15...0")
  func qosRelativeClamps() {
    #expect(Queue.QoS.utility.relative(-40).relativePriority == -15)
    #expect(Queue.QoS.utility.relative(3).relativePriority == 0)
    #expect(Queue.QoS.utility.relative(-7) == Queue.QoS(rawClass: Queue.QoS.utility.rawClass, relativePriority: -7))
  }

  @Test("work submitted to a queue with a QoS runs")
  func qosQueueRuns() {
    let ran = Event()
    Queue(label: "qos.runs", qos: .background).async { ran.signal() }
    #expect(ran.wait())
  }

  // MARK: - Global and main queues

  @Test("Queue.global(_:) gives a concurrent, global queue that runs work", arguments: Queue.Priority.allCases)
  func globalQueues(priority: Queue.Priority) {
    let queue = Queue.global(priority)
    #expect(queue.isGlobal)
    #expect(queue.kind == .concurrent)
    #expect(queue === Queue.global(priority))
    #expect(!queue.label.isEmpty)
    let ran = Event()
    queue.async {
      #expect(queue.isCurrent)
      ran.signal()
    }
    #expect(ran.wait())
    #expect(queue.sync { 42 } == 42)
  }

  // libdispatch reports class 0 (unspecified), not default, for the default
  // global queue, so `.default` is left out.
  @Test(
    "the high, low and background global queues report the QoS class of their priority",
    arguments: [(Queue.Priority.high, Queue.QoS.userInitiated), (.low, .utility), (.background, .background)])
  func globalQueueQoS(priority: Queue.Priority, qos: Queue.QoS) {
    #expect(Queue.global(priority).qos.rawClass == qos.rawClass)
  }

  @Test(
    "Queue.global(qos:) is the global queue of the class; the classes a Priority names give the same queue",
    arguments: [
      (Queue.QoS.userInitiated, Queue.Priority.high), (.default, .default), (.unspecified, .default),
      (.utility, .low), (.background, .background),
    ])
  func globalQueueByQoS(qos: Queue.QoS, priority: Queue.Priority) {
    #expect(Queue.global(qos: qos) === Queue.global(priority))
    #expect(Queue.global(qos: qos.relative(-8)) === Queue.global(priority), "a global queue has no relative priority")
  }

  @Test("Queue.global(qos: .userInteractive) is the user-initiated global queue on Linux, as in C, and runs work")
  func userInteractiveGlobalQueue() {
    let queue = Queue.global(qos: .userInteractive)
    #expect(queue === Queue.global(.high))
    #expect(queue.label == "com.apple.root.user-initiated-qos")
    let ran = Event()
    queue.async { ran.signal() }
    #expect(ran.wait())
  }

  @Test("Queue.global(qos:) with a raw value that is no QoS class stops with a message naming it")
  func globalQueueByUnknownClass() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      _ = Queue.global(qos: Queue.QoS(rawClass: 0x42))
    }
    #expect(standardError(of: result).contains("Queue.global(qos:): 0x42 is not a QoS class"))
  }

  @Test("QoS(rawClass:relativePriority:) clamps the relative priority to -15...0, as relative(_:) does")
  func qosInitializerClamps() {
    #expect(Queue.QoS(rawClass: Queue.QoS.utility.rawClass, relativePriority: -40).relativePriority == -15)
    #expect(Queue.QoS(rawClass: Queue.QoS.utility.rawClass, relativePriority: 7).relativePriority == 0)
    #expect(Queue.QoS(rawClass: Queue.QoS.utility.rawClass, relativePriority: -40) == .utility.relative(-15))
    // Before the clamp, -40 reached dispatch_queue_attr_make_with_qos_class, which then dropped the
    // whole QoS silently: the queue reported unspecified.
    let queue = Queue(label: "qos.clamped", qos: Queue.QoS(rawClass: Queue.QoS.utility.rawClass, relativePriority: -40))
    #expect(queue.qos == .utility.relative(-15))
  }

  @Test("the global queues of different priorities are different queues")
  func globalQueuesDiffer() {
    let labels = Set(Queue.Priority.allCases.map { Queue.global($0).label })
    #expect(labels.count == Queue.Priority.allCases.count)
    #expect(Queue.global() === Queue.global(.default))
  }

  @Test("Queue.main is serial and global, runs work one item at a time, and sees itself as current")
  func mainQueue() {
    #expect(Queue.main.isGlobal)
    #expect(Queue.main.kind == .serial)
    #expect(Queue.main.label == "com.apple.main-thread")
    let meter = OverlapMeter()
    let order = Recorder<Int>()
    let done = Latch(count: 100)
    for index in 0..<100 {
      Queue.main.async {
        meter.enter()
        order.append(index)
        if !Queue.main.isCurrent { Issue.record("Queue.main is not current in its own work") }
        meter.exit()
        done.signal()
      }
    }
    #expect(done.wait())
    #expect(order.values == Array(0..<100))
    #expect(meter.maximum == 1)
  }

  // The test runner's entry point is an `async` main, which ends in
  // libdispatch's `dispatch_main()` (not this package's `Queue.dispatchMain()`,
  // which drains the main queue on the main thread). On Linux that parks the
  // main thread for good (libdispatch calls `pthread_exit` on it) and turns
  // the main queue into an ordinary serial queue drained by worker threads:
  // in this process, main-queue work and @MainActor code do not run on the
  // main thread, and no test body can.
  @Test("after dispatch_main, the main queue is drained by worker threads (Linux)")
  func mainQueueAfterDispatchMain() {
    #expect(cgcd_is_main_thread() == 0)
    let onMainThread = Mutex<Bool?>(nil)
    let ran = Event()
    Queue.main.async {
      onMainThread.withLock { $0 = cgcd_is_main_thread() != 0 }
      ran.signal()
    }
    #expect(ran.wait())
    #expect(onMainThread.withLock { $0 } == false)
  }

  @Test("Queue.isMainThread is false on the threads tests and queue work run on")
  func isMainThread() {
    #expect(!Queue.isMainThread)
    #expect(Queue(label: "not.main").sync { Queue.isMainThread } == false)
  }

  @Test("Queue.main.sync from a thread that is not running the main queue returns the value")
  func mainSyncFromBackground() {
    #expect(Queue.main.sync { Queue.main.isCurrent })
    #expect(Queue.main.sync { 6 * 7 } == 42)
  }

  // MARK: - async / sync / barriers

  @Test("a serial queue runs 10,000 items in FIFO order, one at a time")
  func serialFIFO() {
    let queue = Queue(label: "fifo")
    let order = Recorder<Int>()
    let meter = OverlapMeter()
    let done = Event()
    for index in 0..<10_000 {
      queue.async {
        meter.enter()
        order.append(index)
        meter.exit()
        if index == 9_999 { done.signal() }
      }
    }
    #expect(done.wait())
    #expect(order.values == Array(0..<10_000))
    #expect(meter.maximum == 1)
  }

  @Test("async and sync submissions to a serial queue keep their order")
  func serialOrderMixed() {
    let queue = Queue(label: "mixed")
    let order = Recorder<Int>()
    for index in 0..<100 {
      if index.isMultiple(of: 10) {
        queue.sync { order.append(index) }
      } else {
        queue.async { order.append(index) }
      }
    }
    queue.sync {}
    #expect(order.values == Array(0..<100))
  }

  @Test("sync returns the closure's value and runs it before returning")
  func syncReturnsValue() {
    let queue = Queue(label: "sync.value")
    let ran = Counter()
    let value = queue.sync {
      ran.increment()
      return "result"
    }
    #expect(value == "result")
    #expect(ran.current == 1)
    let concurrent = Queue(label: "sync.value.concurrent", kind: .concurrent)
    #expect(concurrent.sync { [1, 2, 3] } == [1, 2, 3])
    #expect(concurrent.syncBarrier { 7 } == 7)
  }

  @Test("sync can mutate state of the caller (non-escaping closure)")
  func syncNonEscaping() {
    let queue = Queue(label: "sync.mutate")
    var total = 0
    for index in 1...100 { queue.sync { total += index } }
    #expect(total == 5050)
  }

  @Test("sync and syncBarrier rethrow the closure's error, typed")
  func syncRethrows() {
    let queue = Queue(label: "sync.throws")
    #expect(throws: Failure(code: 1)) {
      try queue.sync { () throws(Failure) -> Int in throw Failure(code: 1) }
    }
    #expect(throws: Failure(code: 2)) {
      try queue.syncBarrier { () throws(Failure) in throw Failure(code: 2) }
    }
    do {
      try queue.sync { () throws(Failure) in throw Failure(code: 3) }
      Issue.record("sync did not throw")
    } catch {
      // `error` is statically a Failure: typed throws pass through sync.
      #expect(error.code == 3)
    }
    // The queue is still usable after a throwing work item.
    #expect(queue.sync { 1 } == 1)
  }

  @Test("concurrent queues run items at the same time: two items each wait for the other")
  func concurrencyHappens() {
    let queue = Queue(label: "concurrent.overlap", kind: .concurrent)
    expectTwoItemsAtOnce(on: queue)
  }

  @Test("global queues run items at the same time", arguments: Queue.Priority.allCases)
  func globalConcurrencyHappens(priority: Queue.Priority) {
    let queue = Queue.global(priority)
    expectTwoItemsAtOnce(on: queue)
  }

  @Test("an async barrier waits for earlier items, runs alone, and later items wait for it")
  func asyncBarrierExcludes() {
    let queue = Queue(label: "barrier.async", kind: .concurrent)
    let meter = OverlapMeter()
    let before = Counter()
    let after = Counter()
    let barrierSaw = Mutex<(running: Int, before: Int, after: Int)?>(nil)
    let done = Latch(count: 201)
    for _ in 0..<100 {
      queue.async {
        meter.enter()
        before.increment()
        meter.exit()
        done.signal()
      }
    }
    queue.asyncBarrier {
      let running = meter.enter()
      barrierSaw.withLock { $0 = (running - 1, before.current, after.current) }
      meter.exit()
      done.signal()
    }
    for _ in 0..<100 {
      queue.async {
        meter.enter()
        after.increment()
        meter.exit()
        done.signal()
      }
    }
    #expect(done.wait())
    let saw = barrierSaw.withLock { $0 }
    #expect(saw?.running == 0)
    #expect(saw?.before == 100)
    #expect(saw?.after == 0)
  }

  @Test("a barrier does not start while an earlier item is still running")
  func barrierWaitsForRunningItem() {
    let queue = Queue(label: "barrier.wait", kind: .concurrent)
    let readerStarted = Event()
    let releaseReader = Event()
    let order = Recorder<String>()
    let done = Event()
    queue.async {
      readerStarted.signal()
      releaseReader.wait()
      order.append("reader")
    }
    #expect(readerStarted.wait())
    queue.asyncBarrier {
      order.append("barrier")
      done.signal()
    }
    #expect(!done.wait(timeout: briefTimeout))
    releaseReader.signal()
    #expect(done.wait())
    #expect(order.values == ["reader", "barrier"])
  }

  @Test("syncBarrier waits for earlier items and runs alone")
  func syncBarrierExcludes() {
    let queue = Queue(label: "barrier.sync", kind: .concurrent)
    let meter = OverlapMeter()
    let finished = Counter()
    for _ in 0..<100 {
      queue.async {
        meter.enter()
        finished.increment()
        meter.exit()
      }
    }
    let seen = queue.syncBarrier { (meter.running, finished.current) }
    #expect(seen.0 == 0)
    #expect(seen.1 == 100)
  }

  @Test("on a serial queue a barrier behaves like ordinary work")
  func barrierOnSerialQueue() {
    let queue = Queue(label: "barrier.serial")
    let order = Recorder<Int>()
    queue.async { order.append(1) }
    queue.asyncBarrier { order.append(2) }
    queue.async { order.append(3) }
    queue.syncBarrier { order.append(4) }
    #expect(order.values == [1, 2, 3, 4])
  }

  @Test("work items release their closures after running")
  func closuresReleased() {
    let queue = Queue(label: "release.closure")
    let released = Event()
    do {
      let probe = DeinitProbe(released: released)
      queue.async { _ = probe.id }
    }
    #expect(released.wait())
  }

  // MARK: - apply

  @Test("apply runs each index exactly once and its result equals a serial loop")
  func applyExactlyOnce() {
    let iterations = 10_000
    let queue = Queue(label: "apply", kind: .concurrent)
    let counts = Mutex([Int](repeating: 0, count: iterations))
    let results = Mutex([Int](repeating: 0, count: iterations))
    queue.apply(iterations) { index in
      counts.withLock { $0[index] += 1 }
      results.withLock { $0[index] = index &* index &+ 7 }
    }
    #expect(counts.withLock { $0 }.allSatisfy { $0 == 1 })
    #expect(results.withLock { $0 } == (0..<iterations).map { $0 &* $0 &+ 7 })
  }

  @Test("apply on a global queue runs each index exactly once", arguments: Queue.Priority.allCases)
  func applyOnGlobalQueue(priority: Queue.Priority) {
    let counts = Mutex([Int](repeating: 0, count: 1_000))
    Queue.global(priority).apply(1_000) { index in counts.withLock { $0[index] += 1 } }
    #expect(counts.withLock { $0 } == [Int](repeating: 1, count: 1_000))
  }

  @Test("nested apply, 32 × 32 × 32 on global queues, runs every index triple exactly once")
  func nestedApply() {
    let side = 32
    let counts = Mutex([Int](repeating: 0, count: side * side * side))
    Queue.global().apply(side) { i in
      Queue.global(.high).apply(side) { j in
        Queue.global(.low).apply(side) { k in
          counts.withLock { $0[(i * side + j) * side + k] += 1 }
        }
      }
    }
    #expect(counts.withLock { $0 } == [Int](repeating: 1, count: side * side * side))
  }

  @Test("apply on a serial queue runs the indexes one at a time, in order")
  func applyOnSerialQueue() {
    let queue = Queue(label: "apply.serial")
    let meter = OverlapMeter()
    let order = Recorder<Int>()
    queue.apply(500) { index in
      meter.enter()
      order.append(index)
      #expect(queue.isCurrent)
      meter.exit()
    }
    #expect(meter.maximum == 1)
    #expect(order.values == Array(0..<500))
  }

  @Test("apply with zero iterations returns without calling the body")
  func applyZero() {
    let called = Counter()
    Queue(label: "apply.zero", kind: .concurrent).apply(0) { _ in called.increment() }
    Queue.global().apply(0) { _ in called.increment() }
    #expect(called.current == 0)
  }

  @Test("the body of apply sees its queue as current")
  func applyIsCurrent() {
    let queue = Queue(label: "apply.current", kind: .concurrent)
    let notCurrent = Counter()
    queue.apply(200) { _ in
      if !queue.isCurrent { notCurrent.increment() }
    }
    #expect(notCurrent.current == 0)
  }

  // MARK: - after

  @Test("after(_:) runs the work no earlier than the delay")
  func afterDelay() {
    let queue = Queue(label: "after")
    let clock = SuspendingClock()
    let start = clock.now
    let ranAt = Mutex<SuspendingClock.Instant?>(nil)
    let ran = Event()
    queue.after(.milliseconds(50)) {
      ranAt.withLock { $0 = clock.now }
      ran.signal()
    }
    #expect(ran.wait())
    let elapsed = ranAt.withLock { $0 }.map { start.duration(to: $0) }
    #expect(elapsed.map { $0 >= .milliseconds(50) } == true, "ran after \(String(describing: elapsed))")
  }

  @Test("after(deadline:) with a monotonic deadline runs no earlier than the deadline")
  func afterMonotonicDeadline() {
    let queue = Queue(label: "after.deadline", kind: .concurrent)
    let deadline = Deadline.now + .milliseconds(40)
    let ranAt = Mutex<Deadline?>(nil)
    let ran = Event()
    queue.after(deadline: deadline) {
      ranAt.withLock { $0 = .now }
      ran.signal()
    }
    #expect(ran.wait())
    let at = ranAt.withLock { $0 }
    #expect(at.map { $0.rawValue >= deadline.rawValue } == true)
  }

  @Test("after(deadline:) with a wall-clock deadline runs no earlier than the deadline")
  func afterWallClockDeadline() {
    let queue = Queue(label: "after.wall")
    let start = wallClockNanoseconds()
    let ranAt = Mutex<Int64?>(nil)
    let ran = Event()
    queue.after(deadline: .wallClock() + .milliseconds(50)) {
      ranAt.withLock { $0 = wallClockNanoseconds() }
      ran.signal()
    }
    #expect(ran.wait())
    let elapsed = ranAt.withLock { $0 }.map { $0 - start }
    #expect(elapsed.map { $0 >= 50_000_000 } == true, "ran after \(String(describing: elapsed)) ns")
  }

  @Test("after(deadline:) with a deadline in the past runs soon")
  func afterPastDeadline() {
    let ran = Event()
    Queue(label: "after.past").after(deadline: .now - .seconds(1)) { ran.signal() }
    #expect(ran.wait())
  }

  @Test("after with a zero or negative delay runs the work")
  func afterNonPositive() {
    let queue = Queue(label: "after.zero")
    let ran = Latch(count: 2)
    queue.after(.zero) { ran.signal() }
    queue.after(.seconds(-5)) { ran.signal() }
    #expect(ran.wait())
  }

  @Test("work scheduled after(deadline: .forever) never runs, and dropping its queue is safe")
  func afterForever() {
    let ran = Event()
    do {
      let queue = Queue(label: "after.forever")
      queue.after(deadline: .forever) { ran.signal() }
    }
    #expect(!ran.wait(timeout: briefTimeout))
  }

  // MARK: - _f forms: C functions with a context pointer

  @Test("async(context:function:) calls the C function with the context on the queue")
  func asyncFunction() {
    let queue = Queue(label: "async.f")
    let call = FunctionCall()
    queue.async(context: call.pointer, function: recordCall)
    #expect(call.done.wait())
    #expect(call.count.current == 1)
  }

  @Test("asyncBarrier(context:function:) runs the C function after earlier items, alone")
  func asyncBarrierFunction() {
    let queue = Queue(label: "async.barrier.f", kind: .concurrent)
    let finished = Counter()
    for _ in 0..<50 { queue.async { finished.increment() } }
    let call = FunctionCall(observing: finished)
    queue.asyncBarrier(context: call.pointer, function: recordCall)
    #expect(call.done.wait())
    #expect(call.observed.withLock { $0 } == 50)
  }

  @Test("sync(context:function:) and syncBarrier(context:function:) call the function before returning")
  func syncFunction() {
    let queue = Queue(label: "sync.f", kind: .concurrent)
    let call = FunctionCall()
    queue.sync(context: call.pointer, function: recordCall)
    #expect(call.count.current == 1)
    queue.syncBarrier(context: call.pointer, function: recordCall)
    #expect(call.count.current == 2)
  }

  @Test("asyncAndWait(context:function:) and its barrier form call the function on the queue before returning")
  func asyncAndWaitFunction() {
    let queue = Queue(label: "async-and-wait.f", kind: .concurrent)
    let call = FunctionCall()
    queue.asyncAndWait(context: call.pointer, function: recordCall)
    #expect(call.count.current == 1)
    let finished = Counter()
    for _ in 0..<50 { queue.async { finished.increment() } }
    let barrier = FunctionCall(observing: finished)
    queue.asyncAndWaitBarrier(context: barrier.pointer, function: recordCall)
    #expect(barrier.count.current == 1)
    #expect(barrier.observed.withLock { $0 } == 50, "the barrier ran after the 50 items before it")
  }

  @Test("after(deadline:context:function:) calls the function no earlier than the deadline")
  func afterFunction() {
    let queue = Queue(label: "after.f")
    let call = FunctionCall()
    let deadline = Deadline.now + .milliseconds(30)
    queue.after(deadline: deadline, context: call.pointer, function: recordCall)
    #expect(call.done.wait())
    #expect(call.count.current == 1)
    #expect(call.calledAt.withLock { $0 }.map { $0.rawValue >= deadline.rawValue } == true)
  }

  @Test("apply(_:context:function:) calls the function once per index with the context")
  func applyFunction() {
    let counts = IndexCounts(count: 1_000)
    Queue(label: "apply.f", kind: .concurrent).apply(1_000, context: counts.pointer, function: countIndex)
    #expect(counts.counts.withLock { $0 } == [Int](repeating: 1, count: 1_000))
    Queue(label: "apply.f.serial").apply(1_000, context: counts.pointer, function: countIndex)
    #expect(counts.counts.withLock { $0 } == [Int](repeating: 2, count: 1_000))
  }

  @Test("a nil context is passed through as nil")
  func nilContext() {
    let queue = Queue(label: "nil.context")
    queue.sync(context: nil, function: expectNilContext)
    queue.async(context: nil, function: expectNilContext)
    queue.sync {}
    #expect(nilContextCalls.load(ordering: .relaxed) >= 2)
  }
}

// MARK: - Activation, suspension, targets

extension QueueTests {
  @Test("an initially inactive queue runs nothing until activate()", arguments: [Queue.Kind.serial, .concurrent])
  func initiallyInactive(kind: Queue.Kind) {
    let queue = Queue(label: "inactive", kind: kind, initiallyInactive: true)
    #expect(!queue.isActive)
    let ran = Event()
    queue.async { ran.signal() }
    #expect(!ran.wait(timeout: briefTimeout))
    queue.activate()
    #expect(queue.isActive)
    #expect(ran.wait())
    queue.activate()  // a second activate() does nothing
    #expect(queue.isActive)
    #expect(queue.sync { 1 } == 1)
  }

  @Test("activate() on a queue created active does nothing")
  func activateActiveQueue() {
    let queue = Queue(label: "active")
    queue.activate()
    #expect(queue.isActive)
    #expect(queue.sync { true })
  }

  @Test("an inactive queue created with a target runs nothing until activate(), then runs on the target")
  func inactiveWithTarget() {
    let target = Queue(label: "inactive.target")
    let queue = Queue(label: "inactive.targeted", target: target, initiallyInactive: true)
    #expect(!queue.isActive)
    let ran = Event()
    let targetWasCurrent = Mutex(false)
    queue.async {
      targetWasCurrent.withLock { $0 = target.isCurrent }
      ran.signal()
    }
    #expect(!ran.wait(timeout: briefTimeout))
    queue.activate()
    #expect(ran.wait())
    #expect(targetWasCurrent.withLock { $0 })
  }

  @Test("a queue created with a target (and not inactive) is active and runs at once")
  func activeWithTarget() {
    let target = Queue(label: "target")
    let queue = Queue(label: "targeted", target: target)
    #expect(queue.isActive)
    #expect(queue.sync { target.isCurrent })
  }

  @Test("nothing runs while a queue is suspended; suspensions nest and must all be resumed")
  func suspendResume() {
    let queue = Queue(label: "suspend")
    #expect(queue.suspensionCount == 0)
    queue.suspend()
    #expect(queue.suspensionCount == 1)
    let ran = Event()
    queue.async { ran.signal() }
    #expect(!ran.wait(timeout: briefTimeout))
    queue.suspend()
    #expect(queue.suspensionCount == 2)
    queue.resume()
    #expect(queue.suspensionCount == 1)
    #expect(!ran.wait(timeout: briefTimeout))
    queue.resume()
    #expect(queue.suspensionCount == 0)
    #expect(ran.wait())
  }

  @Test("suspend() lets the running item finish and holds back the queued ones")
  func suspendWhileRunning() {
    let queue = Queue(label: "suspend.running")
    let started = Event()
    let release = Event()
    let firstDone = Event()
    let secondRan = Event()
    queue.async {
      started.signal()
      release.wait()
      firstDone.signal()
    }
    queue.async { secondRan.signal() }
    #expect(started.wait())
    queue.suspend()
    release.signal()
    #expect(firstDone.wait())
    #expect(!secondRan.wait(timeout: briefTimeout))
    queue.resume()
    #expect(secondRan.wait())
  }

  @Test("a concurrent queue can be suspended and resumed too")
  func suspendConcurrent() {
    let queue = Queue(label: "suspend.concurrent", kind: .concurrent)
    queue.suspend()
    let ran = Latch(count: 10)
    for _ in 0..<10 { queue.async { ran.signal() } }
    #expect(!ran.wait(timeout: briefTimeout))
    #expect(ran.count == 10)
    queue.resume()
    #expect(ran.wait())
  }

  @Test("suspensionCount is exact under concurrent balanced suspend/resume pairs")
  func suspensionCountConcurrent() {
    let queue = Queue(label: "suspend.count")
    Queue.global().apply(1_000) { _ in
      queue.suspend()
      queue.resume()
    }
    #expect(queue.suspensionCount == 0)
    #expect(queue.sync { true })
  }

  @Test("work on queues targeting a serial queue is serialised with the target's own work")
  func setTargetSerialises() {
    let target = Queue(label: "serial.target")
    let first = Queue(label: "targeting.concurrent", kind: .concurrent)
    let second = Queue(label: "targeting.serial")
    first.setTarget(target)
    second.setTarget(target)
    let meter = OverlapMeter()
    let targetNotCurrent = Counter()
    let done = Latch(count: 600)
    for _ in 0..<200 {
      for queue in [first, second, target] {
        queue.async {
          meter.enter()
          if !target.isCurrent { targetNotCurrent.increment() }
          meter.exit()
          done.signal()
        }
      }
    }
    #expect(done.wait())
    #expect(meter.maximum == 1)
    #expect(targetNotCurrent.current == 0)
  }

  @Test("setTarget on a suspended target holds back the targeting queue's work")
  func setTargetFollowsTargetSuspension() {
    let target = Queue(label: "target.suspended")
    let queue = Queue(label: "follows.target")
    queue.setTarget(target)
    target.suspend()
    let ran = Event()
    queue.async { ran.signal() }
    #expect(!ran.wait(timeout: briefTimeout))
    target.resume()
    #expect(ran.wait())
  }

  @Test("setTarget can change the target of an active queue created without a target")
  func retarget() {
    let first = Queue(label: "first.target")
    let second = Queue(label: "second.target")
    let queue = Queue(label: "retargeted")
    queue.setTarget(first)
    #expect(queue.sync { first.isCurrent && !second.isCurrent })
    queue.setTarget(second)
    #expect(queue.sync { second.isCurrent && !first.isCurrent })
    let concurrent = Queue(label: "retargeted.concurrent", kind: .concurrent, qos: .utility)
    concurrent.setTarget(first)
    #expect(concurrent.sync { first.isCurrent })
  }

  @Test("setTarget can set the target of an inactive queue before it is activated")
  func targetWhileInactive() {
    let target = Queue(label: "target.inactive")
    let queue = Queue(label: "inactive.retargeted", initiallyInactive: true)
    queue.setTarget(target)
    queue.activate()
    #expect(queue.sync { target.isCurrent })
  }

  // Regression: `init(label:target:)` used to create the queue inactive to
  // set the target, and libdispatch forbids re-targeting such a queue once
  // it is active: the process died in `_dispatch_lane_set_target_queue`.
  @Test("setTarget can change the target given at creation")
  func retargetQueueCreatedWithTarget() async {
    await #expect(processExitsWith: .success) {
      let first = Queue(label: "created.first")
      let second = Queue(label: "created.second")
      let queue = Queue(label: "created.with.target", target: first)
      queue.setTarget(second)
      if !blocking({ queue.sync { second.isCurrent } }) { exit(2) }
    }
  }

  // Re-targeting a queue created inactive after activate() is a libdispatch
  // client error; like resume() without suspend(), it stops with a message
  // naming the queue rather than libdispatch's bare trap.
  @Test("setTarget after activate() on a queue created inactive stops with a message naming the queue")
  func retargetAfterActivation() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let target = Queue(label: "late.target")
      let queue = Queue(label: "activated.queue", initiallyInactive: true)
      queue.activate()
      queue.setTarget(target)
    }
    #expect(standardError(of: result).contains("activated.queue"))
  }

  @Test("a chain of targets: every queue of the chain is current inside the first")
  func targetChain() {
    let root = Queue(label: "chain.root")
    let middle = Queue(label: "chain.middle", target: root)
    let leaf = Queue(label: "chain.leaf", kind: .concurrent, target: middle)
    let seen = leaf.sync { (leaf.isCurrent, middle.isCurrent, root.isCurrent) }
    #expect(seen == (true, true, true))
    #expect(middle.sync { leaf.isCurrent } == false)
  }

  @Test("a queue targeting a global queue runs and sees the global queue as current")
  func targetGlobal() {
    let queue = Queue(label: "to.global", target: Queue.global(.low))
    #expect(queue.sync { Queue.global(.low).isCurrent })
    let ran = Event()
    queue.async { ran.signal() }
    #expect(ran.wait())
  }

  @Test("a queue keeps its target alive after the caller drops it")
  func targetKeptAlive() {
    let queue: Queue
    let ran = Event()
    do {
      let target = Queue(label: "dropped.target")
      queue = Queue(label: "keeps.target", target: target)
    }
    queue.async { ran.signal() }
    #expect(ran.wait())
  }

  @Test("a re-targeted queue keeps every target it had until it is dropped, then lets them all go")
  func retargetedQueueKeepsEveryTarget() {
    weak var first: Queue?
    weak var second: Queue?
    var queue: Queue? = Queue(label: "retargeted")
    do {
      let one = Queue(label: "first.target")
      let two = Queue(label: "second.target")
      first = one
      second = two
      queue?.setTarget(one)
      queue?.setTarget(two)
      queue?.setTarget(.global(.low))
    }
    // Dropped by the caller, replaced as targets: still alive, so that a
    // chain walk that read an older target stays valid.
    #expect(first != nil && second != nil)
    let seen = queue?.sync { (queue?.isCurrent, Queue.global(.low).isCurrent, first?.isCurrent) }
    #expect(seen?.0 == true && seen?.1 == true && seen?.2 == false)
    queue = nil
    #expect(first == nil && second == nil)
  }
}

// MARK: - Dropping a queue in any state, and misuse that must stop the process

extension QueueTests {
  @Test("a queue dropped while suspended twice, with work queued, is safe and the work still runs")
  func dropSuspendedTwice() async {
    await #expect(processExitsWith: .success) {
      dropSuspendedQueueWithWork()
    }
  }

  @Test("a queue created inactive and dropped is safe, and its queued work still runs")
  func dropInactive() async {
    await #expect(processExitsWith: .success) {
      dropInactiveQueueWithWork()
    }
  }

  @Test("a queue created inactive, never given work, and dropped is safe")
  func dropInactiveEmpty() async {
    await #expect(processExitsWith: .success) {
      for index in 0..<100 {
        _ = Queue(
          label: "inactive.\(index)", kind: index.isMultiple(of: 2) ? .serial : .concurrent, initiallyInactive: true)
      }
    }
  }

  @Test("a queue created inactive, suspended, given work and dropped is safe and the work runs")
  func dropInactiveSuspended() async {
    await #expect(processExitsWith: .success) {
      dropInactiveSuspendedQueueWithWork()
    }
  }

  @Test("dropping a queue in the same breath as its work (suspended, inactive, targeted) in bulk is safe")
  func dropManyAwkwardQueues() {
    let ran = Latch(count: 300)
    let target = Queue(label: "bulk.target")
    for index in 0..<100 {
      let suspended = Queue(label: "bulk.suspended.\(index)", kind: .concurrent)
      suspended.suspend()
      suspended.async { ran.signal() }
      let inactive = Queue(label: "bulk.inactive.\(index)", target: target, initiallyInactive: true)
      inactive.async { ran.signal() }
      let targeted = Queue(label: "bulk.targeted.\(index)", target: target)
      targeted.suspend()
      targeted.suspend()
      targeted.async { ran.signal() }
    }
    #expect(ran.wait())
  }

  @Test("a queue dropped from inside its own last work item is safe")
  func dropFromInsideOwnWork() {
    let done = Event()
    do {
      let queue = Queue(label: "self.dropping")
      queue.async { [queue] in
        _ = queue.label
        done.signal()
      }
    }
    #expect(done.wait())
  }

  @Test("resume() without a matching suspend() stops with a message naming the queue")
  func unbalancedResume() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      Queue(label: "never.suspended").resume()
    }
    #expect(standardError(of: result).contains("Queue 'never.suspended': resume() without a matching suspend()"))
  }

  @Test("one resume() too many after balanced pairs stops with a message naming the queue")
  func oneResumeTooMany() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let queue = Queue(label: "once.suspended")
      queue.suspend()
      queue.resume()
      queue.resume()
    }
    #expect(standardError(of: result).contains("Queue 'once.suspended': resume() without a matching suspend()"))
  }

  @Test("suspend() on a global queue stops with a message")
  func suspendGlobal() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      Queue.global(.low).suspend()
    }
    #expect(standardError(of: result).contains("is a global queue; it cannot be suspended"))
  }

  @Test("resume() on the main queue stops with a message")
  func resumeMain() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      Queue.main.resume()
    }
    #expect(standardError(of: result).contains("Queue 'com.apple.main-thread' is a global queue"))
  }

  @Test("setTarget on a global queue stops with a message")
  func setTargetOnGlobal() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      Queue.global().setTarget(Queue(label: "some.target"))
    }
    #expect(standardError(of: result).contains("its target cannot be changed"))
  }

  @Test("setTarget to itself stops with a message naming the queue")
  func setTargetSelf() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let queue = Queue(label: "self.target")
      queue.setTarget(queue)
    }
    #expect(standardError(of: result).contains("Queue 'self.target': setTarget('self.target') would make a cycle"))
  }

  @Test("setTarget that closes a cycle of targets stops with a message naming the queues")
  func setTargetCycle() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let first = Queue(label: "cycle.first")
      let second = Queue(label: "cycle.second", target: first)
      let third = Queue(label: "cycle.third", target: second)
      first.setTarget(third)
    }
    #expect(standardError(of: result).contains("Queue 'cycle.first': setTarget('cycle.third') would make a cycle"))
  }

  @Test("apply with a negative iteration count stops the process (with a message in debug builds)")
  func applyNegative() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      blocking { Queue(label: "apply.negative").apply(-1) { _ in } }
    }
    // `precondition` messages are compiled out of optimized builds.
    #if DEBUG
      #expect(standardError(of: result).contains("negative iteration count -1"))
    #endif
  }

  // libdispatch drops `dispatch_after` with DISPATCH_TIME_FOREVER without
  // ever running or releasing the work; `after` must not box the closure then.
  @Test("after(deadline: .forever) and a clamped after(.seconds(Int64.max)) release their closure")
  func afterForeverReleasesClosure() {
    let released = Latch(count: 2)
    let queue = Queue(label: "after.forever.release")
    do {
      let deinits = Counter()
      let first = DeinitProbe(deinits: deinits)
      let second = DeinitProbe(deinits: deinits)
      // The waiters hold the probes' events, not the probes.
      let firstReleased = first.released
      let secondReleased = second.released
      Queue.global().async {
        if firstReleased.wait() { released.signal() }
      }
      Queue.global().async {
        if secondReleased.wait() { released.signal() }
      }
      queue.after(deadline: .forever) { _ = first.id }
      queue.after(.seconds(Int64.max)) { _ = second.id }
    }
    #expect(released.wait())
  }

  @Test("Queue.dispatchMain() called off the main thread stops with a message")
  func dispatchMainOffMainThread() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      Queue.dispatchMain()
    }
    #expect(standardError(of: result).contains("Queue.dispatchMain() must be called on the main thread"))
  }
}

// MARK: - Exit-test bodies that block (exit-test closures are async)

private func dropSuspendedQueueWithWork() {
  let ran = Latch(count: 3)
  do {
    let queue = Queue(label: "dropped.suspended")
    queue.suspend()
    queue.suspend()
    for _ in 0..<3 { queue.async { ran.signal() } }
  }
  requireInChild(ran, "work of a queue dropped while suspended did not run")
}

private func dropInactiveQueueWithWork() {
  let ran = Latch(count: 2)
  do {
    let queue = Queue(label: "dropped.inactive", kind: .concurrent, initiallyInactive: true)
    queue.async { ran.signal() }
    queue.asyncBarrier { ran.signal() }
  }
  requireInChild(ran, "work of a queue dropped while inactive did not run")
}

private func dropInactiveSuspendedQueueWithWork() {
  let ran = Latch(count: 1)
  do {
    let queue = Queue(label: "dropped.inactive.suspended", initiallyInactive: true)
    queue.suspend()
    queue.async { ran.signal() }
  }
  requireInChild(ran, "work of a queue dropped while inactive and suspended did not run")
}

// MARK: - C functions of these tests

private final class IndexCounts: Sendable {
  let counts: Mutex<[Int]>
  init(count: Int) { counts = Mutex([Int](repeating: 0, count: count)) }
  var pointer: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }
}

private func countIndex(_ context: UnsafeMutableRawPointer?, _ index: Int) {
  let counts = Unmanaged<IndexCounts>.fromOpaque(context!).takeUnretainedValue()
  counts.counts.withLock { $0[index] += 1 }
}

private let nilContextCalls = Atomic<Int>(0)

private func expectNilContext(_ context: UnsafeMutableRawPointer?) {
  #expect(context == nil)
  nilContextCalls.add(1, ordering: .relaxed)
}
