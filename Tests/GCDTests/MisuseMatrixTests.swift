import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// The rows of the misuse matrix (docs/reliability.md) that no other suite
/// covers: every wrapper type in every awkward state, each in a child
/// process, with the documented outcome — no trap where the wrapper can
/// prevent it, otherwise a message naming the object.
///
/// The other rows live next to the type they test: SourceLifecycleTests
/// (every source type dropped never started, suspended once or twice,
/// active, cancelled once or twice, inside its own handler, captured by its
/// handler; resume() without suspend()), QueueTests (queues dropped inactive
/// or suspended with work queued, from inside their own work; unbalanced
/// resume; bad targets), GroupTests (unmatched enter, leave without enter),
/// SemaphoreTests (below its starting value), ReentrancyTests (re-entrant
/// sync) and GCDObjectTests (finalizers after a drop with work queued).
@Suite("Misuse matrix")
struct MisuseMatrixTests {
  // MARK: - Sources: states that must not trap

  @Test("every source type: cancel() then resume() before it was ever started runs the cancel handler only")
  func resumedAfterCancelBeforeStart() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      runLifecycle(.resumedAfterCancelBeforeStart)
    }
    #expect(!standardError(of: result).contains("exit-test child:"), "\(standardError(of: result))")
  }

  @Test("every source type: suspended, cancelled, then resumed (balanced) is safe; the cancel handler runs once")
  func cancelledWhileSuspendedThenResumed() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      runLifecycle(.cancelledWhileSuspendedThenResumed)
    }
    #expect(!standardError(of: result).contains("exit-test child:"), "\(standardError(of: result))")
  }

  @Test("every source type: dropped while its event waits on a suspended queue; no event handler runs after")
  func droppedWhileEventQueued() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      runLifecycle(.droppedWhileEventQueued)
    }
    #expect(!standardError(of: result).contains("exit-test child:"), "\(standardError(of: result))")
  }

  // MARK: - Sources: resume() without suspend() for the two Linux-built types

  @Test("resume() on a running ProcSource stops the process with a message naming the type")
  func procDoubleResume() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      resumeRunningSource(.proc)
    }
    #expect(standardError(of: result).contains("ProcSource.resume() without a matching suspend()"))
  }

  @Test("resume() on a running FileSystemSource stops the process with a message naming the type")
  func fileSystemDoubleResume() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      resumeRunningSource(.fileSystem)
    }
    #expect(standardError(of: result).contains("FileSystemSource.resume() without a matching suspend()"))
  }

  // MARK: - Sources: resume() after cancel() of a running source

  // libdispatch kills the process with a bare SIGILL (an over-resume); the
  // wrapper cannot know what was meant, so it stops with a message instead.

  @Test("resume() after cancel() of a running TimerSource stops with a message naming the type")
  func timerResumeAfterCancel() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      resumeCancelledSource(.timer)
    }
    let text = standardError(of: result)
    #expect(text.contains("TimerSource.resume() without a matching suspend()"))
    #expect(text.contains("the source is cancelled"))
  }

  @Test("resume() after cancel() of a running ReadSource stops with a message naming the type")
  func readResumeAfterCancel() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      resumeCancelledSource(.read)
    }
    #expect(standardError(of: result).contains("ReadSource.resume() without a matching suspend()"))
  }

  @Test("resume() after cancel() of a running WriteSource stops with a message naming the type")
  func writeResumeAfterCancel() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      resumeCancelledSource(.write)
    }
    #expect(standardError(of: result).contains("WriteSource.resume() without a matching suspend()"))
  }

  @Test("resume() after cancel() of a running SignalSource stops with a message naming the type")
  func signalResumeAfterCancel() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      resumeCancelledSource(.signal)
    }
    #expect(standardError(of: result).contains("SignalSource.resume() without a matching suspend()"))
  }

  @Test("resume() after cancel() of a running DataAddSource stops with a message naming the type")
  func dataAddResumeAfterCancel() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      resumeCancelledSource(.dataAdd)
    }
    #expect(standardError(of: result).contains("DataAddSource.resume() without a matching suspend()"))
  }

  @Test("resume() after cancel() of a running DataOrSource stops with a message naming the type")
  func dataOrResumeAfterCancel() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      resumeCancelledSource(.dataOr)
    }
    #expect(standardError(of: result).contains("DataOrSource.resume() without a matching suspend()"))
  }

  @Test("resume() after cancel() of a running DataReplaceSource stops with a message naming the type")
  func dataReplaceResumeAfterCancel() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      resumeCancelledSource(.dataReplace)
    }
    #expect(standardError(of: result).contains("DataReplaceSource.resume() without a matching suspend()"))
  }

  @Test("resume() after cancel() of a running ProcSource stops with a message naming the type")
  func procResumeAfterCancel() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      resumeCancelledSource(.proc)
    }
    #expect(standardError(of: result).contains("ProcSource.resume() without a matching suspend()"))
  }

  @Test("resume() after cancel() of a running FileSystemSource stops with a message naming the type")
  func fileSystemResumeAfterCancel() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      resumeCancelledSource(.fileSystem)
    }
    #expect(standardError(of: result).contains("FileSystemSource.resume() without a matching suspend()"))
  }

  // MARK: - Groups dropped by their own work

  @Test("a group whose last reference is its own notify handler's capture is released inside that handler")
  func groupDroppedInsideItsNotify() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      dropGroupInsideItsNotify()
    }
    #expect(!standardError(of: result).contains("exit-test child:"), "\(standardError(of: result))")
  }

  @Test("a group whose last reference is held by its own async work is released when that work ends")
  func groupDroppedInsideItsWork() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      dropGroupInsideItsWork()
    }
    #expect(!standardError(of: result).contains("exit-test child:"), "\(standardError(of: result))")
  }
}

// MARK: - Exit-test bodies

/// Creates a running source of `kind`, cancels it and resumes it again.
private func resumeCancelledSource(_ kind: SourceKind) {
  let (source, _, _) = kind.make(queue: .global())
  source.resume()
  source.cancel()
  source.resume()
}

/// Counts the finalizer calls of the groups below; their context is this
/// counter (any non-nil context makes libdispatch call the finalizer).
private let groupFinalizers = Atomic<Int>(0)

private func countGroupFinalizer(_ context: UnsafeMutableRawPointer?) {
  groupFinalizers.add(1, ordering: .sequentiallyConsistent)
}

/// The notify closure holds the only reference to the group (a cycle until
/// it runs): the group goes when the handler returns, and libdispatch
/// finalizes it.
private func dropGroupInsideItsNotify() {
  let notified = Event()
  let queue = Queue(label: "matrix.group.notify")
  do {
    let group = Group()
    group.context = UnsafeMutableRawPointer(bitPattern: 0x1)
    group.setFinalizer(countGroupFinalizer)
    group.enter()
    group.notify(on: queue) { [group] in
      _ = group
      notified.signal()
    }
    group.leave()
  }
  requireInChild(notified, "the notify handler did not run")
  childRequire(pollUntil { groupFinalizers.load(ordering: .sequentiallyConsistent) == 1 }, "the group was not released")
}

/// The caller lets go at once; the group's own async work holds it until
/// it has run.
private func dropGroupInsideItsWork() {
  let release = Event()
  let ran = Latch(count: 3)
  do {
    let group = Group()
    group.context = UnsafeMutableRawPointer(bitPattern: 0x1)
    group.setFinalizer(countGroupFinalizer)
    for _ in 0..<3 {
      group.async(on: .global()) {
        release.wait()
        ran.signal()
      }
    }
  }
  childRequire(groupFinalizers.load(ordering: .sequentiallyConsistent) == 0, "released while its work was pending")
  release.signal()
  requireInChild(ran, "the group's work did not run")
  childRequire(pollUntil { groupFinalizers.load(ordering: .sequentiallyConsistent) == 1 }, "the group was not released")
}
