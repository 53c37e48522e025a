import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Registration never depends on a user queue: every sequence the package makes (`makeEvents()`,
/// `SignalSource.sequence(of:)`, `SignalSource.withSignals`) returns once the kernel watches, also
/// when its queue is suspended, inactive, or the caller's own; the event sent right after is kept.
///
/// Each kind runs in an exit-test child bounded by `alarm(30)`: a call that never returns dies of
/// SIGALRM, and a signal sent before the kernel watches takes its default action (it ends the
/// child). A signal is sent with `kill(getpid(), …)` right after the sequence is made, before the
/// queue runs anything; the queue is started after that, and the event must come.
@Suite("Registration")
struct RegistrationTests {
  @Test("SignalSource.sequence(of:) on a suspended, an inactive and the caller's own queue")
  func signalSequence() async {
    expectChildPassed(
      await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
        bound()
        for (placement, signal) in zip(QueuePlacement.allCases, [SIGUSR1, SIGUSR2, SIGHUP]) {
          let queue = placement.makeQueue()
          let signals = try placement.make(on: queue) {
            let signals = try SignalSource.sequence(of: [signal], queue: queue)
            kill(getpid(), signal)
            return signals
          }
          placement.start(queue)
          let seen = await first(of: signals)
          childCheck(seen == signal, "\(placement): \(String(describing: seen))")
        }
        endChild("ok")
      })
  }

  @Test("SignalSource.makeEvents() on a suspended, an inactive and the caller's own queue")
  func signalEvents() async {
    expectChildPassed(
      await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
        bound()
        for (placement, signal) in zip(QueuePlacement.allCases, [SIGUSR1, SIGUSR2, SIGHUP]) {
          let queue = placement.makeQueue()
          let source = try SignalSource(signal: signal, queue: queue)
          let events = placement.make(on: queue) {
            let events = source.makeEvents()
            kill(getpid(), signal)
            return events
          }
          placement.start(queue)
          let count = try await first(of: events)
          childCheck(count == 1, "\(placement): \(String(describing: count)) deliveries")
          childCheck(source.queue === queue, "\(placement): the source's queue is not the one it was made with")
        }
        endChild("ok")
      })
  }

  @Test("DataAddSource, TimerSource and ReadSource makeEvents() on each placement; handlers on the user's queue")
  func dataAndTimerEvents() async {
    expectChildPassed(
      await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
        bound()
        for placement in QueuePlacement.allCases {
          let queue = placement.makeQueue()
          let data = DataAddSource(queue: queue)
          var ends: [Int32] = [-1, -1]
          childCheck(pipe(&ends) == 0, "pipe")
          let read = try ReadSource(fileDescriptor: ends[0], queue: queue)
          let timer = TimerSource(queue: queue)
          timer.schedule(start: .now)
          let cancelledOnQueue = Event()
          // The user's handlers set before the sequence runs on the user's queue, never elsewhere.
          timer.setCancelHandler { if queue.isCurrent { cancelledOnQueue.signal() } }
          let (dataEvents, timerEvents) = placement.make(on: queue) {
            let events = data.makeEvents()
            data.merge(3)
            return (events, timer.makeEvents())
          }
          let readEvents = placement.make(on: queue) {
            let events = read.makeEvents()
            _ = write(ends[1], "ab", 2)
            return events
          }
          placement.start(queue)
          let sum = try await first(of: dataEvents)
          childCheck(sum == 3, "\(placement): data \(String(describing: sum))")
          let fires = try await first(of: timerEvents) ?? 0
          childCheck(fires >= 1, "\(placement): timer \(fires)")
          let available = try await first(of: readEvents)
          childCheck(available == 2, "\(placement): read \(String(describing: available))")
          close(ends[1])
          childCheck(
            blocking { cancelledOnQueue.wait() }, "\(placement): the timer's cancel handler did not run on its queue")
        }
        endChild("ok")
      })
  }

  @Test("SignalSource.withSignals on a suspended and an inactive queue")
  func scopedSignals() async {
    expectChildPassed(
      await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
        bound()
        for (placement, signal) in zip([QueuePlacement.suspended, .inactive], [SIGUSR1, SIGUSR2]) {
          let queue = placement.makeQueue()
          let seen = try await SignalSource.withSignals([signal], queue: queue) { signals in
            kill(getpid(), signal)
            placement.start(queue)
            for await delivered in signals { return delivered }
            return 0
          }
          childCheck(seen == signal, "\(placement): \(seen)")
        }
        endChild("ok")
      })
  }
}

/// The first element of `sequence` (leaving the loop ends it), or nil if it ends first.
private func first<S: AsyncSequence>(of sequence: S) async throws(S.Failure) -> S.Element? {
  var iterator = sequence.makeAsyncIterator()
  return try await iterator.next(isolation: nil)
}

/// Ends the child with SIGALRM after 30 s: a registration that waits on the user's queue never
/// returns.
private func bound() { alarm(30) }

/// Where a sequence is made: on a suspended queue, on an inactive queue, or from inside the queue.
enum QueuePlacement: CaseIterable, CustomStringConvertible {
  case suspended, inactive, own

  var description: String {
    switch self {
    case .suspended: "suspended queue"
    case .inactive: "inactive queue"
    case .own: "from inside its own queue"
    }
  }

  func makeQueue() -> Queue {
    switch self {
    case .suspended:
      let queue = Queue(label: "registration.suspended")
      queue.suspend()
      return queue
    case .inactive: return Queue(label: "registration.inactive", initiallyInactive: true)
    case .own: return Queue(label: "registration.own")
    }
  }

  /// Runs `body` where this placement makes the sequence: on the queue itself for `.own`.
  func make<T, E: Error>(on queue: Queue, _ body: () throws(E) -> T) throws(E) -> T {
    switch self {
    case .own: return try queue.sync(body)
    case .suspended, .inactive: return try body()
    }
  }

  /// Lets the queue run.
  func start(_ queue: Queue) {
    switch self {
    case .suspended: queue.resume()
    case .inactive: queue.activate()
    case .own: break
    }
  }
}

extension RegistrationTests {
  @Test(
    "a signal source on the default global queue stays on the registration queue; its handlers run on the global queue")
  func defaultGlobalQueue() async {
    expectChildPassed(
      await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
        bound()
        let global = Queue.global()
        let source = try SignalSource(signal: SIGUSR1, queue: global)
        let registered = Event()
        let cancelled = Event()
        source.setRegistrationHandler { if global.isCurrent { registered.signal() } }
        source.setCancelHandler { if global.isCurrent { cancelled.signal() } }
        let events = source.makeEvents()
        kill(getpid(), SIGUSR1)
        let count = try await first(of: events)
        childCheck(count == 1, "\(String(describing: count)) deliveries")
        childCheck(blocking { registered.wait() }, "the registration handler did not run on the global queue")
        childCheck(blocking { cancelled.wait() }, "the cancel handler did not run on the global queue")
        childCheck(source.queue === global, "the source's queue")
        endChild("ok")
      })
  }

  @Test("a signal sent right after withSignals registered on a queue of the user's is delivered, round after round")
  func retargetedDeliveryRounds() async {
    expectChildPassed(
      await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
        bound()
        signal(SIGUSR2, SIG_IGN)
        let rounds = runningUnderSanitizer ? 50 : 400
        for round in 0..<rounds {
          // A queue of the user's: the sources stay on the package's queue after registering (never
          // a new target after activation), and the signal sent at once must come.
          let queue = Queue(label: "registration.rounds")
          let seen = try await SignalSource.withSignals([SIGUSR2, SIGUSR1], queue: queue) { signals in
            kill(getpid(), SIGUSR2)
            for await signal in signals { return signal }
            return 0
          }
          childCheck(seen == SIGUSR2, "round \(round): \(seen)")
        }
        endChild("ok")
      })
  }

  /// The source and its sequence dropped right after `makeEvents()`: the drop cancels the source,
  /// whose cancel block runs on the registration queue (the source stays there) and must still
  /// send the user's cancel handler on to the source's queue, once, while the caller's references
  /// are gone: the state holds the queue for it (`SourceState.locked.queue`), and the C source
  /// its +1 of `startRegistering`.
  @Test("a signal source dropped with its sequence and its queue at once: its cancel handler runs on that queue")
  func droppedWithItsQueue() async {
    expectChildPassed(
      await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
        bound()
        let rounds = runningUnderSanitizer ? 300 : 3_000
        let onQueue = Atomic(0)
        for _ in 0..<rounds {
          let queue = Queue(label: "registration.dropped")
          // SIGURG is ignored by default: a stray one ends nothing.
          let source = try SignalSource(signal: SIGURG, queue: queue)
          // Weak: only the source may keep its queue (a handler that held it would hide a queue
          // freed under the send).
          source.setCancelHandler { [weak queue] in
            if queue?.isCurrent == true { onQueue.add(1, ordering: .relaxed) }
          }
          _ = source.makeEvents()  // dropped at once: the source is cancelled
        }
        childCheck(
          blocking { pollUntil { onQueue.load(ordering: .relaxed) == rounds } },
          "\(onQueue.load(ordering: .relaxed)) of \(rounds) cancel handlers ran on their queue")
        endChild("ok")
      })
  }

  /// The registration window, raced: a `cancel()` or a `setTarget(_:)` from another thread while a
  /// signal sequence's source registers on the package's registration queue. Interleavings: the
  /// cancel lands before the registration block (the cancel block then ends the wait and must send
  /// the user's cancel handler on to the user's queue), or after it (the same: the source stays on
  /// the registration queue); the setTarget lands inside the window or after it (only recorded
  /// either way: the queue the user's handlers are sent on to). Each round
  /// checks: `makeEvents()` returned, the cancel handler ran once and on the queue the source
  /// ended on, the registration handler (if it ran) on a queue of the source's, never elsewhere.
  @Test("cancel() and setTarget(_:) racing a sequence's registration: handlers only ever on the source's queues")
  func racingTheWindow() async {
    expectChildPassed(
      await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
        bound()
        blocking { raceRegistrationWindow(rounds: runningUnderSanitizer ? 300 : 3_000) }
        endChild("ok")
      })
  }
}

@available(*, noasync, message: "blocks the thread")
private func raceRegistrationWindow(rounds: Int) {
  let racer = Queue(label: "registration.racer")
  // Every round's queues are kept to the end: ThreadSanitizer's libdispatch interceptor remembers,
  // unretained, the queue a source targets when a handler is set, and reads it after each call of
  // that handler; the package's cancel block may still be in that read when the round's last wait
  // returns, and a freed queue there stops TSan with a CHECK (`IsQueueSerial`, width 0: seen once
  // in a CI run; docs/reliability.md, "Two crashes seen in the sanitized runs").
  var kept: [Queue] = []
  defer { withExtendedLifetime(kept) {} }
  for round in 0..<rounds {
    let first = Queue(label: "registration.first")
    let second = Queue(label: "registration.second")
    // SIGURG is ignored by default: a stray one ends nothing.
    let source = try! SignalSource(signal: SIGURG, queue: first)
    let cancelRuns = Atomic(0)
    let cancelledRight = Event()
    let registrationWrong = Atomic(false)
    let retargets = round.isMultiple(of: 2)
    source.setRegistrationHandler {
      if !first.isCurrent && !second.isCurrent { registrationWrong.store(true, ordering: .relaxed) }
    }
    source.setCancelHandler {
      cancelRuns.add(1, ordering: .relaxed)
      if (retargets ? second : first).isCurrent { cancelledRight.signal() }
    }
    let go = Atomic(false)
    let raced = Group()
    raced.async(on: racer) {
      while !go.load(ordering: .acquiring) {}
      if retargets {
        source.setTarget(second)
        source.cancel()
      } else {
        source.cancel()
      }
    }
    go.store(true, ordering: .releasing)
    let events = source.makeEvents()
    childCheck(raced.wait(timeout: generousTimeout), "round \(round): the racer did not finish")
    childCheck(cancelledRight.wait(), "round \(round): the cancel handler did not run on the source's queue")
    // The handler ran once: wait for anything queued behind it on both queues, then count.
    first.sync {}
    second.sync {}
    childCheck(
      cancelRuns.load(ordering: .relaxed) == 1, "round \(round): \(cancelRuns.load(ordering: .relaxed)) cancel runs")
    childCheck(!registrationWrong.load(ordering: .relaxed), "round \(round): the registration handler ran elsewhere")
    childCheck(source.queue === (retargets ? second : first), "round \(round): the source's queue")
    withExtendedLifetime(events) {}
    kept += [first, second]
  }
}

/// A signal sequence's sources never depend on the user's queue after the call either: the scope
/// of `withSignals` ends, and the deliveries come, while the queue stays suspended or inactive; and
/// no source is retargeted once active, which `LIBDISPATCH_STRICT=1` would stop.
extension RegistrationTests {
  @Test("withSignals on a queue that stays suspended or inactive: the deliveries come and the scope ends")
  func scopedOnHeldQueue() async {
    expectChildPassed(
      await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
        bound()
        for (placement, signal) in zip([QueuePlacement.suspended, .inactive], [SIGUSR1, SIGUSR2]) {
          let queue = placement.makeQueue()
          let none = try await SignalSource.withSignals([signal], queue: queue) { _ in 0 }
          childCheck(none == 0, "\(placement): the empty scope")
          let seen = try await SignalSource.withSignals([signal], queue: queue) { signals in
            kill(getpid(), signal)
            for await delivered in signals { return delivered }
            return 0
          }
          childCheck(seen == signal, "\(placement): \(seen)")
          placement.start(queue)
        }
        endChild("ok")
      })
  }

  /// libdispatch reads `LIBDISPATCH_STRICT` once, when it starts: this test runs
  /// `strictOwnQueueChild` in a new process of this test binary that starts with it (an exit
  /// test's child inherits the parent's libdispatch mode). Before the fix the package gave each
  /// source its user's queue as a new target once active, and the child died of SIGILL.
  @Test(
    "sequence(of:queue:) on its own serial queue under LIBDISPATCH_STRICT=1: a signal is delivered, no trap",
    .timeLimit(.minutes(1)))
  func strictOwnQueue() throws {
    var ends: [Int32] = [-1, -1]
    #expect(pipe(&ends) == 0)
    // Close-on-exec: no other test's child inherits the write end (and holds the output open).
    for end in ends { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
    let pid = try spawnProcess(
      "/proc/self/exe", ["--testing-library", "swift-testing", "--filter", "strictOwnQueueChild"],
      stdout: ends[1], environment: ["LIBDISPATCH_STRICT=1", "GCD_STRICT_CHILD=1"])
    close(ends[1])
    let output = readToEnd(ends[0])
    close(ends[0])
    let status = reapProcess(pid)
    #expect(status == 0, "the child's wait status: \(status)\n\(output)")
    #expect(output == "strict child: 20 rounds\n", "the child's output: \(output)")
  }

  /// The child of `strictOwnQueue` (skipped unless it is that child).
  @Test(
    "strictOwnQueue's child: sequence(of:queue:) on its own serial queue, 20 rounds",
    .enabled(if: getenv("GCD_STRICT_CHILD") != nil))
  func strictOwnQueueChild() async throws {
    bound()
    for round in 0..<20 {
      let queue = Queue(label: "registration.strict")
      let signals = try SignalSource.sequence(of: [SIGUSR1, SIGUSR2], queue: queue)
      let signal = round.isMultiple(of: 2) ? SIGUSR1 : SIGUSR2
      kill(getpid(), signal)
      var iterator = signals.makeAsyncIterator()
      #expect(await iterator.next() == signal)
    }
    // Standard output is the parent's pipe (the testing library writes to standard error).
    let text = Array("strict child: 20 rounds\n".utf8)
    _ = text.withUnsafeBytes { write(STDOUT_FILENO, $0.baseAddress, $0.count) }
  }
}
