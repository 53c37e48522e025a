import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// `isCurrent`, and the re-entrancy check of `sync`, `syncBarrier` and
/// `apply`: calls that can never finish stop the process with a message
/// naming the queue; calls that can finish must not be stopped.
///
/// Every crash-or-not outcome runs as an exit test, in a child process, so
/// that one trap cannot take the suite down. Bodies that expect the child to
/// die block on an event afterwards and exit 0 if they survive, so a missed
/// check fails the test instead of hanging it.
@Suite("Re-entrancy")
struct ReentrancyTests {
  // MARK: - isCurrent

  @Test("isCurrent is false outside any queue")
  func isCurrentOutside() {
    #expect(!Queue(label: "outside").isCurrent)
    #expect(!Queue.main.isCurrent)
    #expect(!Queue.global().isCurrent)
  }

  @Test("isCurrent is true inside async work of the queue, false for other queues")
  func isCurrentInsideAsync() {
    let queue = Queue(label: "current.async")
    let other = Queue(label: "current.other")
    let seen = Mutex<(Bool, Bool)?>(nil)
    let done = Event()
    queue.async {
      seen.withLock { $0 = (queue.isCurrent, other.isCurrent) }
      done.signal()
    }
    #expect(done.wait())
    #expect(seen.withLock { $0 } ?? (false, true) == (true, false))
  }

  @Test("isCurrent inside sync, syncBarrier and asyncBarrier work")
  func isCurrentInsideSync() {
    let queue = Queue(label: "current.sync", kind: .concurrent)
    #expect(queue.sync { queue.isCurrent })
    #expect(queue.syncBarrier { queue.isCurrent })
    let done = Event()
    let seen = Mutex(false)
    queue.asyncBarrier {
      seen.withLock { $0 = queue.isCurrent }
      done.signal()
    }
    #expect(done.wait())
    #expect(seen.withLock { $0 })
  }

  @Test("inside a nested sync both the outer and the inner queue are current")
  func isCurrentNested() {
    let outer = Queue(label: "current.outer")
    let inner = Queue(label: "current.inner", kind: .concurrent)
    let innermost = Queue(label: "current.innermost")
    let seen = Mutex<[Bool]>([])
    let done = Event()
    outer.async {
      inner.sync {
        innermost.sync {
          seen.withLock { $0 = [outer.isCurrent, inner.isCurrent, innermost.isCurrent] }
        }
        seen.withLock { $0.append(innermost.isCurrent) }
      }
      seen.withLock { $0.append(inner.isCurrent) }
      done.signal()
    }
    #expect(done.wait())
    #expect(seen.withLock { $0 } == [true, true, true, false, false])
  }

  @Test("isCurrent sees a queue through the queues that target it")
  func isCurrentThroughTarget() {
    let target = Queue(label: "current.target")
    let queue = Queue(label: "current.targeting", target: target)
    let seen = Mutex<(Bool, Bool)?>(nil)
    let done = Event()
    queue.async {
      seen.withLock { $0 = (target.isCurrent, queue.isCurrent) }
      done.signal()
    }
    #expect(done.wait())
    #expect(seen.withLock { $0 } ?? (false, false) == (true, true))
    // The other way round: work of the target does not run on the queue.
    #expect(target.sync { queue.isCurrent } == false)
  }

  @Test("work submitted from inside a queue's work does not inherit it")
  func isCurrentNotInherited() {
    let first = Queue(label: "current.first")
    let second = Queue(label: "current.second")
    let seen = Mutex<Bool?>(nil)
    let done = Event()
    first.async {
      second.async {
        seen.withLock { $0 = first.isCurrent }
        done.signal()
      }
    }
    #expect(done.wait())
    #expect(seen.withLock { $0 } == false)
  }

  @Test("isCurrent is false again after the work returns (no frame leaks onto the thread)")
  func isCurrentRestored() {
    let queue = Queue(label: "current.restored")
    _ = queue.sync { 1 }
    #expect(!queue.isCurrent)
    #expect(throws: CancellationError.self) {
      try queue.sync { () throws(CancellationError) in throw CancellationError() }
    }
    #expect(!queue.isCurrent)
    queue.apply(3) { _ in }
    #expect(!queue.isCurrent)
  }

  // MARK: - Calls that can finish are not stopped

  @Test("sync onto a concurrent queue from inside its own non-barrier work completes")
  func syncConcurrentFromInside() {
    let queue = Queue(label: "concurrent.reenter", kind: .concurrent)
    let value = Mutex<Int?>(nil)
    let done = Event()
    queue.async {
      value.withLock { $0 = queue.sync { 41 } + 1 }
      done.signal()
    }
    #expect(done.wait())
    #expect(value.withLock { $0 } == 42)
    #expect(queue.sync { queue.sync { 7 } } == 7)
  }

  @Test("apply onto a concurrent queue from inside its own work completes")
  func applyConcurrentFromInside() {
    let queue = Queue(label: "concurrent.apply.reenter", kind: .concurrent)
    let counts = Mutex([Int](repeating: 0, count: 64))
    queue.sync {
      queue.apply(64) { index in counts.withLock { $0[index] += 1 } }
    }
    #expect(counts.withLock { $0 } == [Int](repeating: 1, count: 64))
  }

  @Test("sync between different serial queues, in both nesting orders at different times, completes")
  func syncOtherQueues() {
    let first = Queue(label: "pair.first")
    let second = Queue(label: "pair.second")
    #expect(first.sync { second.sync { 1 } } == 1)
    #expect(second.sync { first.sync { 2 } } == 2)
  }

  @Test("sync onto a queue from work that queue submitted asynchronously elsewhere completes")
  func syncFromWorkSubmittedByQueue() {
    let first = Queue(label: "submitter")
    let second = Queue(label: "submitted")
    let value = Mutex<Int?>(nil)
    let done = Event()
    first.async {
      second.async {
        value.withLock { $0 = first.sync { 5 } }
        done.signal()
      }
    }
    #expect(done.wait())
    #expect(value.withLock { $0 } == 5)
  }

  @Test("sync onto the target from a queue's work after the target was changed away completes")
  func syncOldTarget() {
    let oldTarget = Queue(label: "old.target")
    let newTarget = Queue(label: "new.target")
    let queue = Queue(label: "moved")
    queue.setTarget(oldTarget)
    queue.setTarget(newTarget)
    #expect(queue.sync { oldTarget.sync { 3 } } == 3)
  }

  // MARK: - Calls that can never finish stop with a message

  @Test("sync onto the current serial queue, directly, stops with a message naming the queue")
  func syncDirect() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let queue = Queue(label: "reentrant.direct")
      blocking { queue.sync { queue.sync {} } }
    }
    let text = standardError(of: result)
    #expect(text.contains("Queue 'reentrant.direct'.sync would deadlock"))
    #expect(text.contains("the current thread is already running on it"))
  }

  @Test("sync onto the current queue from inside its async work stops with a message")
  func syncFromAsync() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      syncFromInsideAsync()
    }
    #expect(standardError(of: result).contains("Queue 'reentrant.async'.sync would deadlock"))
  }

  @Test("sync onto a queue held further out, nested through another queue, stops with a message")
  func syncNestedThroughOther() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let outer = Queue(label: "reentrant.outer")
      let middle = Queue(label: "reentrant.middle", kind: .concurrent)
      blocking { outer.sync { middle.sync { outer.sync {} } } }
    }
    #expect(standardError(of: result).contains("Queue 'reentrant.outer'.sync would deadlock"))
  }

  @Test("sync onto a serial target from its targeting queue's work stops with a message naming the target")
  func syncOntoTargetFromTargeting() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let target = Queue(label: "reentrant.target")
      let queue = Queue(label: "reentrant.targeting", target: target)
      blocking { queue.sync { target.sync {} } }
    }
    #expect(standardError(of: result).contains("Queue 'reentrant.target'.sync would deadlock"))
  }

  @Test("sync onto a queue that targets the current serial queue stops with a message naming both")
  func syncThroughTarget() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let target = Queue(label: "through.target")
      let queue = Queue(label: "through.queue", kind: .concurrent, target: target)
      blocking { target.sync { queue.sync {} } }
    }
    let text = standardError(of: result)
    #expect(text.contains("Queue 'through.queue'.sync would deadlock"))
    #expect(text.contains("it runs through queue 'through.target'"))
  }

  @Test("syncBarrier onto a concurrent queue from inside its own work stops with a message")
  func syncBarrierFromInside() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let queue = Queue(label: "reentrant.barrier", kind: .concurrent)
      blocking { queue.sync { queue.syncBarrier {} } }
    }
    #expect(standardError(of: result).contains("Queue 'reentrant.barrier'.syncBarrier would deadlock"))
  }

  @Test("sync onto a concurrent queue from inside its own barrier stops with a message")
  func syncFromInsideBarrier() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let queue = Queue(label: "reentrant.in.barrier", kind: .concurrent)
      blocking { queue.syncBarrier { queue.sync {} } }
    }
    #expect(standardError(of: result).contains("Queue 'reentrant.in.barrier'.sync would deadlock"))
  }

  @Test("apply onto the current serial queue stops with a message")
  func applyOntoCurrentSerial() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let queue = Queue(label: "reentrant.apply")
      blocking { queue.sync { queue.apply(2) { _ in } } }
    }
    #expect(standardError(of: result).contains("Queue 'reentrant.apply'.apply would deadlock"))
  }

  @Test("sync(context:function:) onto the current queue stops with a message")
  func syncFunctionReentrant() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let queue = Queue(label: "reentrant.function")
      blocking { queue.sync { queue.sync(context: nil, function: doNothing) } }
    }
    #expect(standardError(of: result).contains("Queue 'reentrant.function'.sync would deadlock"))
  }

  @Test("sync from inside apply's body onto the serial queue that called apply stops with a message")
  func syncFromApplyBody() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let serial = Queue(label: "reentrant.apply.caller")
      let concurrent = Queue(label: "reentrant.apply.workers", kind: .concurrent)
      blocking { serial.sync { concurrent.apply(4) { _ in serial.sync {} } } }
    }
    #expect(standardError(of: result).contains("Queue 'reentrant.apply.caller'.sync would deadlock"))
  }

  @Test("Queue.main.sync from inside Queue.main's work stops with a message naming the main queue")
  func mainSyncFromMainQueueWork() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      mainSyncFromInsideMainQueue()
    }
    #expect(standardError(of: result).contains("Queue 'com.apple.main-thread'.sync would deadlock"))
  }

  // The test runner is an `async` main program, as many Swift services are:
  // it parks the main thread in libdispatch's dispatch_main (see
  // QueueTests.mainQueueAfterDispatchMain), so no test body can run on the
  // main thread and the "main thread waits for the main queue" branch of the
  // check cannot be reached from here. In such a program @MainActor code runs
  // on the main queue drained by a worker thread, outside any frame of this
  // package: `Queue.main.sync` there deadlocks as surely (libdispatch kills
  // the process with a bare SIGILL), and should stop with the same kind of
  // message.
  @Test("Queue.main.sync from @MainActor code stops with a message naming the main queue")
  func mainSyncFromMainActor() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      await MainActor.run { Queue.main.sync {} }
      exit(0)
    }
    #expect(standardError(of: result).contains("Queue 'com.apple.main-thread'.sync would deadlock"))
  }
}

// MARK: - Exit-test bodies that block (exit-test closures are async)

private func syncFromInsideAsync() {
  let queue = Queue(label: "reentrant.async")
  let survived = Event()
  queue.async {
    queue.sync {}
    survived.signal()
  }
  exitIfSurvived(waitingFor: survived)
}

private func mainSyncFromInsideMainQueue() {
  let survived = Event()
  Queue.main.async {
    Queue.main.sync {}
    survived.signal()
  }
  exitIfSurvived(waitingFor: survived)
}
