import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

@Suite("SignalSource")
struct SignalSourceTests {
  /// The C library's own signals, between the standard ones and SIGRTMIN (glibc: 32 and 33).
  static let libcReserved: [Int32] = Array(32..<__libc_current_sigrtmin())
  /// The signals libdispatch never blocks on its threads, beside SIGSEGV, SIGBUS, SIGILL and SIGFPE:
  /// a source for one loses the event and spins the manager thread (its handler re-raises forever).
  static let unmasked: [Int32] = [SIGTRAP, SIGSYS, SIGPIPE, SIGPROF]
  static let rejected: [Int32] =
    [SIGKILL, SIGSTOP, SIGSEGV, SIGBUS, SIGILL, SIGFPE, 0, 999, -1, 65] + unmasked + libcReserved

  @Test("signals that cannot be observed, and numbers that are not signals, throw EINVAL", arguments: rejected)
  func rejectsUnobservableSignals(signal: Int32) {
    let error = #expect(throws: GCDError.self) {
      _ = try SignalSource(signal: signal, queue: .global())
    }
    #expect(error?.errno == EINVAL)
    #expect(error?.description.contains("SignalSource(signal: \(signal))") == true)
  }

  // (No source is made for the observable ones here: registering one replaces the signal's
  // disposition in the whole test process.)
  @Test("canObserve(_:) is false exactly for the signals the initializer rejects")
  func canObserveMatchesTheInitializer() {
    for signal in SignalSourceTests.rejected { #expect(!SignalSource.canObserve(signal), "\(signal)") }
    for signal in Int32(1)...64 where !SignalSourceTests.rejected.contains(signal) {
      #expect(SignalSource.canObserve(signal), "\(signal)")
    }
  }

  @Test("the C library's own signals (32 and 33 on glibc) are rejected, with a reason that names them")
  func libcSignalsRejected() {
    #expect(!Self.libcReserved.isEmpty)
    for signal in Self.libcReserved {
      let error = #expect(throws: GCDError.self) { _ = try SignalSource(signal: signal, queue: .global()) }
      #expect(error?.errno == EINVAL, "\(signal)")
      #expect(error?.description.contains("glibc") == true, "\(String(describing: error))")
    }
  }

  @Test("canObserve(_:) against delivery: each signal 1...64 it accepts is delivered to a source, in a child")
  func canObserveMatchesDelivery() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      canObserveDeliveryChild()
    }
    #expect(standardError(of: result).contains("exit-test child: ok"), "\(standardError(of: result))")
  }

  /// Ignores SIGUSR1, once per process. Setting a disposition again after libdispatch has registered
  /// a source for the signal replaces the handler libdispatch installed at registration: every source
  /// of that signal would stop receiving it (libdispatch installs its handler only once).
  static let ignoreSIGUSR1: Void = { _ = signal(SIGUSR1, SIG_IGN) }()
  /// SIGPWR ignored once per process, for the test that must see exactly its own deliveries.
  static let ignoreSIGPWR: Void = { _ = signal(SIGPWR, SIG_IGN) }()

  /// A started SIGUSR1 source (SIGUSR1 ignored first, as the listing does with SIGHUP), its event
  /// counts, and an event signalled after each handler call.
  @available(*, noasync, message: "blocks the thread")
  func startSIGUSR1Source(queue: Queue) -> (SignalSource, Recorder<UInt>, Latch) {
    _ = Self.ignoreSIGUSR1
    let source = try! SignalSource(signal: SIGUSR1, queue: queue)
    let counts = Recorder<UInt>()
    let anyEvent = Latch(count: 1)
    let registered = Event()
    source.setRegistrationHandler { registered.signal() }
    source.setEventHandler { [unowned source] in
      counts.append(source.count)
      anyEvent.signal()
    }
    source.resume()
    #expect(registered.wait(), "the source was not registered")
    return (source, counts, anyEvent)
  }

  @Test("a burst of self-sent SIGUSR1s is counted: at least one delivery, never more than were sent")
  func countsSelfSentSignals() {
    let queue = Queue(label: "signal.burst")
    let (source, counts, anyEvent) = startSIGUSR1Source(queue: queue)
    #expect(source.signal == SIGUSR1)
    #expect(source.handle == UInt(SIGUSR1))
    let sent = 5
    for _ in 0..<sent { kill(getpid(), SIGUSR1) }
    #expect(anyEvent.wait())
    let cancelled = Event()
    source.setCancelHandler { cancelled.signal() }
    source.cancel()
    #expect(cancelled.wait())
    let values = counts.values
    let total = values.reduce(0, +)
    #expect(total >= 1 && total <= UInt(sent), "counted \(total) of \(sent) in events \(values)")
    #expect(values.allSatisfy { $0 >= 1 })
  }

  @Test("signals sent one at a time, each after the handler ran, arrive one per event")
  func spacedSignalsArriveAlone() {
    let queue = Queue(label: "signal.spaced")
    // A signal of its own: a SIGUSR1 left over from the burst test before (sent after that source
    // was cancelled) can still be pending for the next SIGUSR1 source and arrive as a fourth event.
    _ = Self.ignoreSIGPWR
    let source = try! SignalSource(signal: SIGPWR, queue: queue)
    let counts = Recorder<UInt>()
    let events = Latch(count: 3)
    let onQueue = Recorder<Bool>()
    let registered = Event()
    let handled = Mutex<[Event]>([Event(), Event(), Event()])
    source.setRegistrationHandler { registered.signal() }
    source.setEventHandler { [unowned source] in
      counts.append(source.count)
      onQueue.append(queue.isCurrent)
      let next = handled.withLock { $0.isEmpty ? nil : $0.removeFirst() }
      next?.signal()
      events.signal()
    }
    let waits = handled.withLock { $0 }
    source.resume()
    #expect(registered.wait())
    for event in waits {
      kill(getpid(), SIGPWR)
      #expect(event.wait())
    }
    #expect(events.wait())
    source.cancel()
    queue.sync {}
    #expect(counts.values == [1, 1, 1])
    #expect(onQueue.values == [true, true, true])
  }

  @Test("two sources for one signal both see it")
  func twoSourcesForOneSignal() {
    let (first, firstCounts, firstEvent) = startSIGUSR1Source(queue: Queue(label: "signal.first"))
    let (second, secondCounts, secondEvent) = startSIGUSR1Source(queue: Queue(label: "signal.second"))
    kill(getpid(), SIGUSR1)
    #expect(firstEvent.wait())
    #expect(secondEvent.wait())
    first.cancel()
    second.cancel()
    #expect(firstCounts.values.reduce(0, +) >= 1)
    #expect(secondCounts.values.reduce(0, +) >= 1)
  }

  @Test("on Linux, registering a signal source replaces the disposition with libdispatch's handler (documented)")
  func dispositionIsLeftAlone() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      signalDispositionChild()
    }
    if let result { #expect(standardError(of: result) == "") }
  }
}

/// The exit-test child of `dispositionIsLeftAlone`: fails unless libdispatch replaced SIG_IGN, and the
/// source still observes the signal afterwards.
func signalDispositionChild() {
  signal(SIGUSR2, SIG_IGN)
  var before = sigaction()
  sigaction(SIGUSR2, nil, &before)
  let source = try! SignalSource(signal: SIGUSR2, queue: .global())
  let registered = Event()
  let delivered = Event()
  source.setRegistrationHandler { registered.signal() }
  // Set before resume(): on an active source libdispatch installs a new handler asynchronously.
  source.setEventHandler { delivered.signal() }
  source.resume()
  childRequire(registered.wait(), "the source was not registered")
  var after = sigaction()
  sigaction(SIGUSR2, nil, &after)
  let handlerBefore = unsafeBitCast(before.__sigaction_handler.sa_handler, to: Int.self)
  let handlerAfter = unsafeBitCast(after.__sigaction_handler.sa_handler, to: Int.self)
  // libdispatch on Linux installs its own handler when the source registers (it re-raises the signal
  // towards its signalfd), replacing SIG_IGN; SIG_DFL would be replaced the same way.
  childRequire(
    handlerBefore != handlerAfter,
    "SIGUSR2 disposition stayed \(handlerBefore) (SIG_IGN); SignalSource documents that libdispatch replaces it")
  kill(getpid(), SIGUSR2)
  childRequire(delivered.wait(), "the source did not observe SIGUSR2")
}

/// The exit-test child of `canObserveMatchesDelivery`: for every signal 1...64, `canObserve` says
/// true exactly when the initializer accepts it, and a source made for an accepted one registers and
/// sees a `kill(getpid(), …)` of it (the signal is ignored first, so a miss is a timeout, not a
/// death, and the child can say which one).
func canObserveDeliveryChild() -> Never {
  var observed: [Int32] = []
  for number in Int32(1)...64 {
    let accepted: SignalSource?
    do { accepted = try SignalSource(signal: number, queue: .global()) } catch { accepted = nil }
    childCheck(
      SignalSource.canObserve(number) == (accepted != nil),
      "canObserve(\(number)) is \(SignalSource.canObserve(number)), the initializer \(accepted == nil ? "throws" : "accepts")"
    )
    guard let source = accepted else { continue }
    _ = signal(number, SIG_IGN)
    let registered = Event()
    let delivered = Event()
    source.setRegistrationHandler { registered.signal() }
    source.setEventHandler { delivered.signal() }
    source.resume()
    childCheck(registered.wait(), "the source for \(number) did not register")
    kill(getpid(), number)
    childCheck(delivered.wait(), "signal \(number) was accepted and never delivered")
    source.cancel()
    observed.append(number)
  }
  let rejected = Set(SignalSourceTests.rejected.filter { (1...64).contains($0) })
  childCheck(observed == (1...64).filter { !rejected.contains($0) }, "observed \(observed)")
  endChild("ok")
}

/// A `SignalSource` dropped once its `makeEvents()` sequence exists. Its sequence registers it on
/// the package's registration queue, whose blocks send the user's work on to the source's queue
/// with the C source held: a reference taken there, after the wrapper released the last one,
/// resurrects the C source (libdispatch traps: SIGILL). Each child loops 100 sources; before the
/// fix the global-queue child died in every run, the registration-handler child in every run.
extension SignalSourceTests {
  @Test("dropped with its sequence on the global queue, the sequence dropped or left with break: no trap")
  func droppedOnGlobalQueue() async {
    await #expect(processExitsWith: .success) {
      alarm(60)
      for round in 0..<100 {
        // SIGURG is ignored by default: a stray one ends nothing.
        let source = try SignalSource(signal: SIGURG, queue: .global())
        if round.isMultiple(of: 2) {
          _ = source.makeEvents()  // dropped at once: the source is cancelled
        } else {
          let events = source.makeEvents()
          kill(getpid(), SIGURG)
          for try await _ in events { break }
        }
      }
      exit(0)
    }
  }

  @Test("dropped with its sequence while a registration handler is set, on serial and global queues: no trap")
  func droppedWithRegistrationHandler() async {
    await #expect(processExitsWith: .success) {
      alarm(60)
      let registered = Atomic(0)
      for round in 0..<100 {
        let queue = round.isMultiple(of: 2) ? Queue(label: "signal.dropped.registration") : .global()
        let source = try SignalSource(signal: SIGURG, queue: queue)
        source.setRegistrationHandler { registered.add(1, ordering: .relaxed) }
        _ = source.makeEvents()
      }
      exit(0)
    }
  }
}
