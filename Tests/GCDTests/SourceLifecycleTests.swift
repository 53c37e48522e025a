import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Every source type this package can construct without privileges.
enum SourceKind: String, CaseIterable, Sendable {
  case timer, read, write, signal, dataAdd, dataOr, dataReplace, proc, fileSystem

  /// The Swift type's name, as `resume()`'s message names it.
  var typeName: String {
    switch self {
    case .timer: "TimerSource"
    case .read: "ReadSource"
    case .write: "WriteSource"
    case .signal: "SignalSource"
    case .dataAdd: "DataAddSource"
    case .dataOr: "DataOrSource"
    case .dataReplace: "DataReplaceSource"
    case .proc: "ProcSource"
    case .fileSystem: "FileSystemSource"
    }
  }

  /// A new source of this kind on `queue`, with what makes it fire once started (`fire`) and what
  /// releases its resources (`cleanup`, for the cancel handler). The source fires as soon as it is
  /// started for timers, reads (a byte is waiting), writes, signals (sent at registration) and
  /// processes (a child that has already exited); a file-system source fires when `fire` appends
  /// to its file.
  func make(queue: Queue) -> (source: Source, fire: @Sendable () -> Void, cleanup: @Sendable () -> Void) {
    switch self {
    case .timer:
      let timer = TimerSource(queue: queue)
      timer.schedule(start: .now, interval: .milliseconds(5))
      return (timer, {}, {})
    case .read:
      let (readEnd, writeEnd) = makePipe()
      _ = Glibc.write(writeEnd, "x", 1)
      return (
        try! ReadSource(fileDescriptor: readEnd, queue: queue), {},
        {
          close(readEnd); close(writeEnd)
        }
      )
    case .write:
      let (readEnd, writeEnd) = makePipe()
      return (
        try! WriteSource(fileDescriptor: writeEnd, queue: queue), {},
        {
          close(readEnd); close(writeEnd)
        }
      )
    case .signal:
      _ = SourceKind.ignoreSIGUSR2
      let source = try! SignalSource(signal: SIGUSR2, queue: queue)
      source.setRegistrationHandler { kill(getpid(), SIGUSR2) }
      return (source, {}, {})
    case .dataAdd:
      let source = DataAddSource(queue: queue)
      return (source, { source.merge(1) }, {})
    case .dataOr:
      let source = DataOrSource(queue: queue)
      return (source, { source.merge(1) }, {})
    case .dataReplace:
      let source = DataReplaceSource(queue: queue)
      return (source, { source.merge(1) }, {})
    case .proc:
      let child = try! spawnProcess("/bin/true")
      precondition(waitForExitWithoutReaping(child), "waitid failed: errno \(errno)")
      return (try! ProcSource(pid: child, queue: queue), {}, { reapProcess(child) })
    case .fileSystem:
      let path = temporaryFile(containing: [])
      let source = try! FileSystemSource(path: path, events: [.write, .delete], queue: queue)
      let append: @Sendable () -> Void = {
        let descriptor = open(path, O_WRONLY | O_APPEND | O_CLOEXEC)
        _ = Glibc.write(descriptor, "x", 1)
        close(descriptor)
      }
      return (source, append, { unlink(path) })
    }
  }

  /// SIGUSR2 ignored once per process (see `SignalSourceTests.ignoreSIGUSR1`).
  static let ignoreSIGUSR2: Void = { _ = Glibc.signal(SIGUSR2, SIG_IGN) }()
}

/// The states a source can be dropped in.
enum LifecycleScenario: String, CaseIterable, Sendable {
  case neverResumed, suspendedOnce, suspendedTwice, suspendedBeforeFirstResume, active, cancelled
  case cancelledTwice, droppedInsideItsHandler, capturedStronglyThenCancelled
  // Rows of the misuse matrix (MisuseMatrixTests).
  case resumedAfterCancelBeforeStart, cancelledWhileSuspendedThenResumed, droppedWhileEventQueued
}

/// Drops a source of every kind in `scenario`'s state and checks, in the exit-test child, that the
/// cancel handler runs exactly once, the captured objects are released and the wrapper goes away.
/// Any failure ends the child with status 3 and a message naming the kind.
func runLifecycle(_ scenario: LifecycleScenario) {
  for kind in SourceKind.allCases { runLifecycle(scenario, kind) }
}

func runLifecycle(_ scenario: LifecycleScenario, _ kind: SourceKind) {
  let what = "\(kind.typeName), \(scenario.rawValue)"
  let queue = Queue(label: "lifecycle.\(kind.rawValue)")
  let cancels = Counter()
  let cancelled = Event()
  let eventProbeReleased = Event()
  let cancelProbeReleased = Event()
  let fired = Event()
  weak var weakSource: (Source)?
  do {
    // The probes live only in the handlers' captures.
    let eventProbe = DeinitProbe(released: eventProbeReleased)
    let cancelProbe = DeinitProbe(released: cancelProbeReleased)
    let (source, fire, cleanup) = kind.make(queue: queue)
    weakSource = source
    source.setCancelHandler { [cancelProbe] in
      _ = cancelProbe
      cleanup()
      cancels.increment()
      cancelled.signal()
    }
    switch scenario {
    case .droppedInsideItsHandler:
      // The only reference is in `holder`; the handler takes it out and drops it.
      let holder = Mutex<(Source)?>(source)
      source.setEventHandler { [eventProbe] in
        _ = eventProbe
        let last = holder.withLock { $0.take() }
        fired.signal()
        _ = last
      }
    case .capturedStronglyThenCancelled:
      source.setEventHandler { [eventProbe, source] in
        _ = (eventProbe, source.data)
        fired.signal()
      }
    default:
      source.setEventHandler { [eventProbe] in
        _ = eventProbe
        fired.signal()
      }
    }
    switch scenario {
    case .neverResumed:
      break
    case .suspendedOnce:
      source.resume()
      fire()
      childRequire(fired.wait(), "\(what): no event before the suspend")
      source.suspend()
    case .suspendedTwice:
      source.resume()
      source.suspend()
      source.suspend()
    case .suspendedBeforeFirstResume:
      source.suspend()
    case .active:
      source.resume()
      fire()
      childRequire(fired.wait(), "\(what): no event")
    case .cancelled:
      source.resume()
      fire()
      source.cancel()
      childRequire(source.isCancelled, "\(what): isCancelled is false after cancel()")
    case .cancelledTwice:
      source.resume()
      source.cancel()
      source.cancel()
      childRequire(source.isCancelled, "\(what): isCancelled is false after cancel()")
    case .droppedInsideItsHandler, .capturedStronglyThenCancelled:
      source.resume()
      fire()
    case .resumedAfterCancelBeforeStart:
      source.cancel()
      source.resume()
    case .cancelledWhileSuspendedThenResumed:
      source.resume()
      source.suspend()
      source.cancel()
      source.resume()
    case .droppedWhileEventQueued:
      // The event (and later the cancel handler) waits on the suspended queue.
      queue.suspend()
      source.resume()
      fire()
    }
  }
  if scenario == .droppedWhileEventQueued { queue.resume() }
  if scenario == .droppedInsideItsHandler || scenario == .capturedStronglyThenCancelled {
    childRequire(fired.wait(), "\(what): no event")
  }
  if scenario == .capturedStronglyThenCancelled {
    // The handler keeps the source alive until it is cancelled.
    childRequire(weakSource != nil, "\(what): the source went away while its handler held it")
    weakSource?.cancel()
  }
  childRequire(cancelled.wait(), "\(what): the cancel handler did not run")
  childRequire(eventProbeReleased.wait(), "\(what): the event handler's captures were not released")
  childRequire(cancelProbeReleased.wait(), "\(what): the cancel handler's captures were not released")
  childRequire(waitUntil { weakSource == nil }, "\(what): the source was not deallocated")
  queue.sync {}
  childRequire(cancels.current == 1, "\(what): the cancel handler ran \(cancels.current) times")
  if scenario == .resumedAfterCancelBeforeStart || scenario == .droppedWhileEventQueued {
    childRequire(!fired.isSignaled, "\(what): the event handler ran after cancel()")
  }
}

/// Cancel is final and prompt: for every kind, a source cancelled while
/// suspended (once or twice) or before it was ever started runs its cancel
/// handler while it is still alive, with no `resume()`; `isSuspended` says
/// suspended before the cancel and not after; the `resume()`s that match
/// the earlier `suspend()`s are accepted afterwards, and no event handler
/// runs after the cancel.
func runPromptCancel() {
  for kind in SourceKind.allCases {
    for suspensions in [-1, 1, 2] {  // -1: never started
      let what = "\(kind.typeName), " + (suspensions < 0 ? "never started" : "suspended \(suspensions)x")
      let queue = Queue(label: "prompt-cancel.\(kind.rawValue)")
      let (source, fire, cleanup) = kind.make(queue: queue)
      let cancelled = Event()
      // Counts the event handler's starts once none can be in progress: the source fires as soon
      // as it starts, so a handler may be running when `suspend()` returns (it finishes; that is
      // the contract), and one reading `isCancelled` could see the cancel that came after its start.
      let watching = Atomic<Bool>(false)
      let eventsAfterCancel = Counter()
      source.setEventHandler { if watching.load(ordering: .sequentiallyConsistent) { eventsAfterCancel.increment() } }
      source.setCancelHandler {
        cleanup()
        cancelled.signal()
      }
      childRequire(!source.isSuspended, "\(what): isSuspended before any suspend()")
      if suspensions > 0 {
        source.resume()
        for _ in 0..<suspensions { source.suspend() }
        childRequire(source.isSuspended, "\(what): isSuspended is false after suspend()")
        queue.sync {}  // a handler that started before the suspension has finished; none starts now
        watching.store(true, ordering: .sequentiallyConsistent)
        fire()
      }
      watching.store(true, ordering: .sequentiallyConsistent)
      source.cancel()
      childRequire(cancelled.wait(), "\(what): the cancel handler did not run without a resume()")
      childRequire(!source.isSuspended, "\(what): isSuspended is true after cancel()")
      for _ in 0..<max(0, suspensions) { source.resume() }
      queue.sync {}
      childRequire(eventsAfterCancel.current == 0, "\(what): an event handler ran after cancel()")
    }
  }
}

/// Creates a running source of `kind` and resumes it once more than it was suspended.
func resumeRunningSource(_ kind: SourceKind) {
  let (source, _, _) = kind.make(queue: .global())
  source.resume()
  source.resume()
}

@Suite("Source life cycle")
struct SourceLifecycleTests {
  @Test("dropped never resumed: no trap, the cancel handler runs once, captures are released")
  func neverResumed() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      runLifecycle(.neverResumed)
    }
    #expect(!standardError(of: result).contains("exit-test child:"), "\(standardError(of: result))")
  }

  @Test("cancel() of a suspended or never-started source runs the cancel handler at once, without resume()")
  func promptCancel() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      runPromptCancel()
    }
    #expect(!standardError(of: result).contains("exit-test child:"), "\(standardError(of: result))")
  }

  @Test("dropped while suspended once")
  func suspendedOnce() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      runLifecycle(.suspendedOnce)
    }
    #expect(!standardError(of: result).contains("exit-test child:"), "\(standardError(of: result))")
  }

  @Test("dropped while suspended twice")
  func suspendedTwice() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      runLifecycle(.suspendedTwice)
    }
    #expect(!standardError(of: result).contains("exit-test child:"), "\(standardError(of: result))")
  }

  @Test("dropped suspended before its first resume")
  func suspendedBeforeFirstResume() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      runLifecycle(.suspendedBeforeFirstResume)
    }
    #expect(!standardError(of: result).contains("exit-test child:"), "\(standardError(of: result))")
  }

  @Test("dropped while active")
  func active() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      runLifecycle(.active)
    }
    #expect(!standardError(of: result).contains("exit-test child:"), "\(standardError(of: result))")
  }

  @Test("dropped after cancel()")
  func cancelled() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      runLifecycle(.cancelled)
    }
    #expect(!standardError(of: result).contains("exit-test child:"), "\(standardError(of: result))")
  }

  @Test("dropped after cancel() twice")
  func cancelledTwice() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      runLifecycle(.cancelledTwice)
    }
    #expect(!standardError(of: result).contains("exit-test child:"), "\(standardError(of: result))")
  }

  @Test("the last reference dropped inside the source's own handler")
  func droppedInsideItsHandler() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      runLifecycle(.droppedInsideItsHandler)
    }
    #expect(!standardError(of: result).contains("exit-test child:"), "\(standardError(of: result))")
  }

  @Test("a handler that captures its source keeps it until cancel(); then everything is released")
  func capturedStronglyThenCancelled() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      runLifecycle(.capturedStronglyThenCancelled)
    }
    #expect(!standardError(of: result).contains("exit-test child:"), "\(standardError(of: result))")
  }

  @Test(
    "in process: cancel() then drop runs the cancel handler exactly once and releases the captures",
    arguments: SourceKind.allCases)
  func cancelInProcess(kind: SourceKind) {
    let queue = Queue(label: "lifecycle.inprocess")
    let cancels = Counter()
    let cancelled = Event()
    let probeReleased = Event()
    let fired = Event()
    weak var weakSource: (Source)?
    do {
      let probe = DeinitProbe(released: probeReleased)
      let (source, fire, cleanup) = kind.make(queue: queue)
      weakSource = source
      source.setEventHandler { [probe] in
        _ = probe
        fired.signal()
      }
      source.setCancelHandler {
        cleanup()
        cancels.increment()
        cancelled.signal()
      }
      #expect(!source.isCancelled)
      source.resume()
      fire()
      #expect(fired.wait())
      source.cancel()
      source.cancel()
      #expect(source.isCancelled)
    }
    #expect(cancelled.wait())
    #expect(probeReleased.wait())
    #expect(waitUntil { weakSource == nil })
    queue.sync {}
    #expect(cancels.current == 1)
  }

  // MARK: - resume() without suspend()

  @Test("resume() on a running TimerSource stops the process with a message naming the type")
  func timerDoubleResume() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      resumeRunningSource(.timer)
    }
    #expect(standardError(of: result).contains("TimerSource.resume() without a matching suspend()"))
  }

  @Test("resume() on a running ReadSource stops the process with a message naming the type")
  func readDoubleResume() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      resumeRunningSource(.read)
    }
    #expect(standardError(of: result).contains("ReadSource.resume() without a matching suspend()"))
  }

  @Test("resume() on a running WriteSource stops the process with a message naming the type")
  func writeDoubleResume() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      resumeRunningSource(.write)
    }
    #expect(standardError(of: result).contains("WriteSource.resume() without a matching suspend()"))
  }

  @Test("resume() on a running SignalSource stops the process with a message naming the type")
  func signalDoubleResume() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      resumeRunningSource(.signal)
    }
    #expect(standardError(of: result).contains("SignalSource.resume() without a matching suspend()"))
  }

  @Test("resume() on a running DataAddSource stops the process with a message naming the type")
  func dataAddDoubleResume() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      resumeRunningSource(.dataAdd)
    }
    #expect(standardError(of: result).contains("DataAddSource.resume() without a matching suspend()"))
  }

  @Test("resume() on a running DataOrSource stops the process with a message naming the type")
  func dataOrDoubleResume() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      resumeRunningSource(.dataOr)
    }
    #expect(standardError(of: result).contains("DataOrSource.resume() without a matching suspend()"))
  }

  @Test("resume() on a running DataReplaceSource stops the process with a message naming the type")
  func dataReplaceDoubleResume() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      resumeRunningSource(.dataReplace)
    }
    #expect(standardError(of: result).contains("DataReplaceSource.resume() without a matching suspend()"))
  }
}
