import CDispatch
import GCD
import Synchronization
import Testing

/// The context slot and the finalizer that every wrapper exposes through
/// `GCDObject`.
///
/// libdispatch's rule: when the last reference to an object goes, the
/// finalizer is called once, with the context, by `dispatch_async_f` onto
/// the object's target queue (for groups and semaphores the default global
/// queue) — so always asynchronously — and only when both the finalizer and
/// the context are non-nil at that moment.
@Suite("GCDObject")
struct GCDObjectTests {
  enum Kind: String, CaseIterable, Sendable {
    case serialQueue, concurrentQueue, inactiveQueue, targetedQueue, group, semaphore

    func make(target: Queue? = nil) -> GCDObject {
      switch self {
      case .serialQueue: Queue(label: "object.serial", target: target)
      case .concurrentQueue: Queue(label: "object.concurrent", kind: .concurrent, target: target)
      case .inactiveQueue: Queue(label: "object.inactive", target: target, initiallyInactive: true)
      case .targetedQueue: Queue(label: "object.targeted", target: target ?? Queue(label: "object.own.target"))
      case .group: Group()
      case .semaphore: try! Semaphore(value: 1)
      }
    }
  }

  // MARK: - Context

  @Test("the context starts nil and reads back what was set", arguments: Kind.allCases)
  func contextRoundTrip(kind: Kind) {
    let object = kind.make()
    #expect(object.context == nil)
    let storage = UnsafeMutablePointer<Int>.allocate(capacity: 1)
    defer { storage.deallocate() }
    object.context = UnsafeMutableRawPointer(storage)
    #expect(object.context == UnsafeMutableRawPointer(storage))
    object.context = UnsafeMutableRawPointer(bitPattern: 0x1000)
    #expect(object.context == UnsafeMutableRawPointer(bitPattern: 0x1000))
    object.context = nil
    #expect(object.context == nil)
  }

  @Test("the package never touches the context slot of a queue it runs, targets, suspends and tags")
  func contextUntouchedByQueueOperations() {
    let marker = UnsafeMutableRawPointer(bitPattern: 0xC0FFEE)
    let target = Queue(label: "context.target")
    let queue = Queue(label: "context.queue", kind: .concurrent, initiallyInactive: true)
    queue.context = marker
    target.context = marker
    queue.setTarget(target)
    queue.activate()
    queue.suspend()
    queue.resume()
    queue.setSpecific(Queue.SpecificKey<Int>(), 1)
    queue.async {}
    queue.asyncBarrier {}
    _ = queue.sync { queue.isCurrent }
    queue.apply(4) { _ in }
    queue.after(.zero) {}
    queue.syncBarrier {}
    #expect(queue.context == marker)
    #expect(target.context == marker)
  }

  @Test("the package never touches the context slot of a group or a semaphore it uses")
  func contextUntouchedByGroupAndSemaphore() throws {
    let marker = UnsafeMutableRawPointer(bitPattern: 0xBEEF)
    let group = Group()
    group.context = marker
    group.enter()
    group.async(on: Queue.global()) {}
    group.leave()
    group.notify(on: Queue.global()) {}
    group.wait()
    #expect(group.context == marker)
    let semaphore = try Semaphore(value: 2)
    semaphore.context = marker
    semaphore.wait()
    semaphore.signal()
    _ = semaphore.wait(timeout: .zero)
    #expect(semaphore.context == marker)
  }

  @Test("unsafeObject is the same C object for the wrapper's life, and distinct per wrapper", arguments: Kind.allCases)
  func unsafeObject(kind: Kind) {
    let first = kind.make()
    let second = kind.make()
    #expect(first.unsafeObject == first.unsafeObject)
    #expect(first.unsafeObject != second.unsafeObject)
  }

  // MARK: - Finalizer

  @Test("the finalizer runs exactly once, with the context, after the last reference goes", arguments: Kind.allCases)
  func finalizerRunsOnce(kind: Kind) {
    let probe = FinalizerProbe()
    do {
      let object = kind.make()
      object.context = probe.pointer
      object.setFinalizer(recordFinalizer)
      #expect(!probe.ran.isSignaled)
    }
    #expect(probe.ran.wait())
    // A second call would be queued behind the first on the same target;
    // give it the chance before counting.
    Queue.global().sync {}
    #expect(probe.calls.withLock { $0 } == [UInt(bitPattern: probe.pointer)])
  }

  @Test(
    "a queue's finalizer runs on the queue's target queue",
    arguments: [Kind.serialQueue, .concurrentQueue, .inactiveQueue])
  func finalizerRunsOnTarget(kind: Kind) {
    let target = Queue(label: "finalizer.target")
    target.setSpecific(finalizerQueueMarker, "finalizer.target")
    let probe = FinalizerProbe()
    do {
      let object = kind.make(target: target)
      object.context = probe.pointer
      object.setFinalizer(recordFinalizer)
    }
    #expect(probe.ran.wait())
    #expect(probe.ranOn.withLock { $0 } == "finalizer.target")
  }

  @Test(
    "the finalizer of a group or semaphore runs on the target set through unsafeObject",
    arguments: [Kind.group, .semaphore])
  func finalizerOfNonQueueOnTarget(kind: Kind) {
    let target = Queue(label: "finalizer.object.target")
    target.setSpecific(finalizerQueueMarker, "finalizer.object.target")
    let probe = FinalizerProbe()
    do {
      let object = kind.make()
      dispatch_set_target_queue(dispatch_object_t(_do: object.unsafeObject), target.unsafeObject)
      object.context = probe.pointer
      object.setFinalizer(recordFinalizer)
    }
    #expect(probe.ran.wait())
    #expect(probe.ranOn.withLock { $0 } == "finalizer.object.target")
  }

  @Test("a queue's finalizer waits until the queue's pending work has run")
  func finalizerWaitsForWork() {
    let probe = FinalizerProbe()
    let release = Event()
    let workDone = Event()
    do {
      let queue = Queue(label: "finalizer.pending")
      queue.context = probe.pointer
      queue.setFinalizer(recordFinalizer)
      queue.async {
        release.wait()
        workDone.signal()
      }
    }
    #expect(!probe.ran.wait(timeout: briefTimeout))
    release.signal()
    #expect(probe.ran.wait())
    #expect(workDone.isSignaled)
  }

  @Test("a queue dropped while suspended still finalizes once its work has run")
  func finalizerAfterSuspendedDrop() {
    let probe = FinalizerProbe()
    let ran = Event()
    do {
      let queue = Queue(label: "finalizer.suspended")
      queue.suspend()
      queue.async { ran.signal() }
      queue.context = probe.pointer
      queue.setFinalizer(recordFinalizer)
    }
    #expect(ran.wait())
    #expect(probe.ran.wait())
  }

  // To see that something was NOT called, route it through a serial queue
  // and wait until that queue has certainly run everything it was given.
  @Test("with a nil context the finalizer is not called (queues)", arguments: [Kind.serialQueue, .concurrentQueue])
  func noFinalizerWithNilContextForQueues(kind: Kind) {
    let calls = nilContextFinalizerCalls.load(ordering: .sequentiallyConsistent)
    let targetProbe = FinalizerProbe()
    do {
      let target = Queue(label: "finalizer.nil.target")
      target.context = targetProbe.pointer
      target.setFinalizer(recordFinalizer)
      let object = kind.make(target: target)
      object.setFinalizer(countNilContextFinalizer)
    }
    // The target finalizes only after the queue has released it, which the
    // queue does after handing its own finalizer (if any) to the target, and
    // the target outlives the work handed to it.
    #expect(targetProbe.ran.wait())
    #expect(nilContextFinalizerCalls.load(ordering: .sequentiallyConsistent) == calls)
  }

  @Test("with a context reset to nil before the last release the finalizer is not called", arguments: Kind.allCases)
  func noFinalizerWithResetContext(kind: Kind) {
    let calls = nilContextFinalizerCalls.load(ordering: .sequentiallyConsistent)
    let target = Queue(label: "finalizer.reset.target")
    do {
      let object = kind.make(target: target)
      if kind == .group || kind == .semaphore {
        dispatch_set_target_queue(dispatch_object_t(_do: object.unsafeObject), target.unsafeObject)
      }
      object.context = UnsafeMutableRawPointer(bitPattern: 0x1234)
      object.setFinalizer(countNilContextFinalizer)
      object.context = nil
    }
    // Groups and semaphores dispose in their deinit; queues when their last
    // work item is done. Flush the target twice to cover a dispose that was
    // itself queued on it.
    target.sync {}
    target.sync {}
    #expect(nilContextFinalizerCalls.load(ordering: .sequentiallyConsistent) == calls)
  }

  @Test("setFinalizer(nil) removes the finalizer")
  func removeFinalizer() {
    let probe = FinalizerProbe()
    let target = Queue(label: "finalizer.removed.target")
    do {
      let queue = Queue(label: "finalizer.removed", target: target)
      queue.context = probe.pointer
      queue.setFinalizer(recordFinalizer)
      queue.setFinalizer(nil)
    }
    target.sync {}
    target.sync {}
    #expect(!probe.ran.wait(timeout: briefTimeout))
  }

  @Test("a finalizer can free a heap context (the C idiom) for every kind", arguments: Kind.allCases)
  func finalizerFreesContext(kind: Kind) {
    let freed = Event()
    do {
      let object = kind.make()
      object.context = Unmanaged.passRetained(DeinitProbe(released: freed)).toOpaque()
      object.setFinalizer(releaseRetainedContext)
    }
    #expect(freed.wait())
  }
}

// MARK: - Finalizer functions and their bookkeeping

/// What a finalizer saw; handed over as the (unretained) context.
final class FinalizerProbe: Sendable {
  let ran = Event()
  /// The context of each call, as an address.
  let calls = Mutex<[UInt]>([])
  let ranOn = Mutex<String?>(nil)

  var pointer: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }
}

/// Marks queues so that a finalizer can tell where it runs.
private let finalizerQueueMarker = Queue.SpecificKey<String>()

private func recordFinalizer(_ context: UnsafeMutableRawPointer?) {
  guard let context else {
    Issue.record("finalizer called with a nil context")
    return
  }
  let probe = Unmanaged<FinalizerProbe>.fromOpaque(context).takeUnretainedValue()
  let address = UInt(bitPattern: context)
  probe.calls.withLock { $0.append(address) }
  probe.ranOn.withLock { $0 = Queue.currentSpecific(finalizerQueueMarker) }
  probe.ran.signal()
}

private let nilContextFinalizerCalls = Atomic<Int>(0)

private func countNilContextFinalizer(_ context: UnsafeMutableRawPointer?) {
  nilContextFinalizerCalls.add(1, ordering: .sequentiallyConsistent)
}

private func releaseRetainedContext(_ context: UnsafeMutableRawPointer?) {
  if let context { Unmanaged<DeinitProbe>.fromOpaque(context).release() }
}
