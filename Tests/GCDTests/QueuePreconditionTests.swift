import GCD
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Checks the predicate on the queue the context points to (`_f` work).
private func checkOnQueue(_ context: UnsafeMutableRawPointer?) {
  let box = Unmanaged<PreconditionBox>.fromOpaque(context!).takeRetainedValue()
  Queue.precondition(box.predicate)
  box.done.signal()
}

private final class PreconditionBox: Sendable {
  let predicate: Queue.Predicate
  let done = Event()
  init(_ predicate: Queue.Predicate) { self.predicate = predicate }
}

@Suite("Queue.precondition")
struct QueuePreconditionTests {
  @Test("holds in closures, sync, targeting queues, _f work and barriers")
  func holds() {
    let queue = Queue(label: "pre.serial")
    let other = Queue(label: "pre.other")
    let concurrent = Queue(label: "pre.concurrent", kind: .concurrent)
    let child = Queue(label: "pre.child", target: queue)
    Queue.precondition(.notOnQueue(queue))
    queue.sync {
      Queue.precondition(.onQueue(queue))
      Queue.precondition(.onQueueAsBarrier(queue))
      Queue.precondition(.notOnQueue(other))
    }
    child.sync { Queue.precondition(.onQueue(queue)) }
    concurrent.syncBarrier { Queue.precondition(.onQueueAsBarrier(concurrent)) }
    concurrent.sync { Queue.precondition(.onQueue(concurrent)) }
    let done = Event()
    queue.async {
      Queue.precondition(.onQueue(queue))
      done.signal()
    }
    #expect(done.wait())
    for (target, predicate) in [
      (queue, Queue.Predicate.onQueue(queue)), (child, .onQueue(queue)), (other, .notOnQueue(queue)),
    ] {
      let box = PreconditionBox(predicate)
      target.async(context: Unmanaged.passRetained(box).toOpaque(), function: checkOnQueue)
      #expect(box.done.wait())
    }
    let barrier = PreconditionBox(.onQueueAsBarrier(concurrent))
    concurrent.asyncBarrier(context: Unmanaged.passRetained(barrier).toOpaque(), function: checkOnQueue)
    #expect(barrier.done.wait())
  }

  @Test("holds in executor jobs")
  func holdsInExecutorJobs() async {
    let serial = SerialQueue(label: "pre.executor")
    await withTaskExecutorPreference(serial) { Queue.precondition(.onQueue(serial)) }
  }

  @Test(".onQueue off the queue stops with a message naming it")
  func onQueueFails() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      Queue.precondition(.onQueue(Queue(label: "pre.absent")))
    }
    #expect(standardError(of: result).contains("Queue.precondition(.onQueue) failed"))
    #expect(standardError(of: result).contains("queue 'pre.absent'"))
  }

  @Test(".notOnQueue on the queue stops with a message naming it")
  func notOnQueueFails() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let queue = Queue(label: "pre.present")
      blocking { queue.sync { Queue.precondition(.notOnQueue(queue)) } }
    }
    #expect(standardError(of: result).contains("Queue.precondition(.notOnQueue) failed"))
    #expect(standardError(of: result).contains("queue 'pre.present'"))
  }

  @Test(".onQueueAsBarrier in non-barrier work of a concurrent queue stops with a message naming it")
  func barrierFails() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let queue = Queue(label: "pre.nobarrier", kind: .concurrent)
      blocking { queue.sync { Queue.precondition(.onQueueAsBarrier(queue)) } }
    }
    #expect(standardError(of: result).contains("Queue.precondition(.onQueueAsBarrier) failed"))
    #expect(standardError(of: result).contains("queue 'pre.nobarrier', but not as a barrier"))
  }

  @Test(".onQueueAsBarrier off the queue stops with a message naming it")
  func barrierOffQueueFails() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      Queue.precondition(.onQueueAsBarrier(Queue(label: "pre.elsewhere", kind: .concurrent)))
    }
    #expect(standardError(of: result).contains("not running work of queue 'pre.elsewhere'"))
  }

  @Test(".onQueue in an actor method on another SerialQueue stops with a message naming the queue")
  func onQueueFromOtherExecutorFails() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let wanted = Queue(label: "pre.wanted")
      let serial = SerialQueue(label: "pre.running")
      await withTaskExecutorPreference(serial) { Queue.precondition(.onQueue(wanted)) }
    }
    #expect(standardError(of: result).contains("queue 'pre.wanted'"))
  }
}
