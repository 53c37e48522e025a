import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Soundness of `isCurrent` and of the checks built on it (`checkIsolated`,
/// `assumeIsolated`, `Queue.precondition`): true only on the thread that
/// runs the queue's work, one thread at a time for a serial queue, and for
/// every submission form, closures and C functions alike.
extension ReentrancyTests {
  // MARK: - apply: the caller holds its queues, the iterations do not run them

  @Test("inside apply called from a serial queue's work, that queue is not current in any iteration")
  func applyIterationsDoNotRunTheCallersQueue() {
    let serial = Queue(label: "isolation.apply.caller")
    let workers = Queue.global()
    let iterations = 64
    let sawCaller = Counter()
    let sawWorkers = Counter()
    let inside = Atomic(0)
    let mostAtOnce = Atomic(0)
    serial.sync {
      workers.apply(iterations) { _ in
        if serial.isCurrent {
          sawCaller.increment()
          let now = inside.wrappingAdd(1, ordering: .relaxed).newValue
          mostAtOnce.max(now, ordering: .relaxed)
          usleep(200)
          inside.wrappingSubtract(1, ordering: .relaxed)
        }
        if workers.isCurrent { sawWorkers.increment() }
      }
      #expect(serial.isCurrent, "the caller still runs the serial queue's work after apply returns")
    }
    #expect(sawCaller.current == 0, "serial.isCurrent held in \(sawCaller.current) of \(iterations) iterations")
    #expect(mostAtOnce.load(ordering: .relaxed) <= 1)
    #expect(sawWorkers.current == iterations, "the queue apply runs on is current in every iteration")
  }

  @Test("apply(context:function:) iterations see the queue apply runs on, not the caller's")
  func applyFunctionIterations() {
    let serial = Queue(label: "isolation.applyf.caller")
    let probe = IterationProbe(caller: serial, workers: Queue.global())
    serial.sync { probe.workers.apply(32, context: probe.pointer, function: probeIteration) }
    #expect(probe.sawCaller.current == 0)
    #expect(probe.sawWorkers.current == 32)
  }

  @Test("an actor on a SerialQueue cannot be entered with assumeIsolated from apply's iterations")
  func assumeIsolatedFromApplyStops() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      blocking { assumeIsolatedInsideApply() }
    }
    // The runtime asks isIsolatingCurrentContext() first and, told no, stops with its own message.
    let text = standardError(of: result)
    #expect(
      text.contains("Incorrect actor executor assumption")
        || text.contains("SerialQueue 'isolation.actor': expected to be isolated"), "\(text)")
  }

  @Test("Queue.precondition(.onQueue) of the caller's serial queue fails inside apply's iterations")
  func preconditionFromApplyStops() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let serial = Queue(label: "isolation.precondition")
      blocking { serial.sync { Queue.global().apply(4) { _ in Queue.precondition(.onQueue(serial)) } } }
    }
    #expect(standardError(of: result).contains("not running work of queue 'isolation.precondition'"))
  }

  @Test("apply onto a serial queue runs its iterations one at a time, each on that queue")
  func applyOntoSerialQueue() {
    let serial = Queue(label: "isolation.apply.serial")
    let current = Counter()
    serial.apply(16) { _ in if serial.isCurrent { current.increment() } }
    #expect(current.current == 16)
  }

  // MARK: - The function forms run inside a frame

  @Test(
    "every context:function: submission form runs its function where isCurrent sees the queue",
    arguments: FunctionForm.allCases)
  func functionFormsRunInFrames(form: FunctionForm) {
    let queue = Queue(label: "isolation.f.\(form)", kind: form.needsConcurrent ? .concurrent : .serial)
    let call = FrameProbe(queue: queue)
    form.submit(call, on: queue)
    #expect(call.done.wait(), "the function of \(form) never ran")
    #expect(call.wasCurrent.load(ordering: .relaxed) == 1, "\(form): isCurrent was false inside the function")
  }

  @Test("a source's C-function event handler runs where isCurrent sees the source's queue")
  func sourceFunctionHandlerRunsInFrame() {
    let queue = Queue(label: "isolation.f.source")
    let source = DataAddSource(queue: queue)
    let call = FrameProbe(queue: queue)
    source.setEventHandler(context: call.pointer, function: probeFrame)
    source.resume()
    source.merge(1)
    #expect(call.done.wait())
    #expect(call.wasCurrent.load(ordering: .relaxed) == 1)
    source.cancel()
  }

  @Test("sync onto the queue from work submitted with async(context:function:) stops with the deadlock message")
  func syncFromFunctionWorkStopsWithMessage() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      syncFromInsideFunctionWorkOnItsQueue()
    }
    #expect(standardError(of: result).contains("Queue 'isolation.f.reentrant'.sync would deadlock"))
  }
}

/// What a C-convention test function sees about the queue it runs on.
final class FrameProbe: Sendable {
  let queue: Queue
  let wasCurrent = Atomic(-1)
  let done = Event()
  init(queue: Queue) { self.queue = queue }
  var pointer: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }
}

private func probeFrame(_ context: UnsafeMutableRawPointer?) {
  let probe = Unmanaged<FrameProbe>.fromOpaque(context!).takeUnretainedValue()
  probe.wasCurrent.store(probe.queue.isCurrent ? 1 : 0, ordering: .relaxed)
  probe.done.signal()
}

/// The `context:function:` forms that submit work to a queue.
enum FunctionForm: String, CaseIterable, CustomTestStringConvertible {
  case async, asyncBarrier, sync, syncBarrier, asyncAndWait, asyncAndWaitBarrier, after, groupAsync, groupNotify

  var testDescription: String { rawValue }
  var needsConcurrent: Bool { self == .asyncBarrier || self == .syncBarrier || self == .asyncAndWaitBarrier }

  func submit(_ probe: FrameProbe, on queue: Queue) {
    switch self {
    case .async: queue.async(context: probe.pointer, function: probeFrame)
    case .asyncBarrier: queue.asyncBarrier(context: probe.pointer, function: probeFrame)
    case .sync: blocking { queue.sync(context: probe.pointer, function: probeFrame) }
    case .syncBarrier: blocking { queue.syncBarrier(context: probe.pointer, function: probeFrame) }
    case .asyncAndWait: blocking { queue.asyncAndWait(context: probe.pointer, function: probeFrame) }
    case .asyncAndWaitBarrier: blocking { queue.asyncAndWaitBarrier(context: probe.pointer, function: probeFrame) }
    case .after: queue.after(deadline: .now + .milliseconds(1), context: probe.pointer, function: probeFrame)
    case .groupAsync: Group().async(on: queue, context: probe.pointer, function: probeFrame)
    case .groupNotify: Group().notify(on: queue, context: probe.pointer, function: probeFrame)
    }
  }
}

private final class IterationProbe: Sendable {
  let caller: Queue
  let workers: Queue
  let sawCaller = Counter()
  let sawWorkers = Counter()
  init(caller: Queue, workers: Queue) {
    self.caller = caller
    self.workers = workers
  }
  var pointer: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }
}

private func probeIteration(_ context: UnsafeMutableRawPointer?, _ index: Int) {
  let probe = Unmanaged<IterationProbe>.fromOpaque(context!).takeUnretainedValue()
  if probe.caller.isCurrent { probe.sawCaller.increment() }
  if probe.workers.isCurrent { probe.sawWorkers.increment() }
}

private actor QueueBoundCounter {
  nonisolated let queue: SerialQueue
  var count = 0
  init(queue: SerialQueue) { self.queue = queue }
  nonisolated var unownedExecutor: UnownedSerialExecutor { queue.asUnownedSerialExecutor() }
  func bump() { count += 1 }
}

private func assumeIsolatedInsideApply() {
  let queue = SerialQueue(label: "isolation.actor")
  let counter = QueueBoundCounter(queue: queue)
  queue.sync {
    // Allowed here: the thread runs the queue's work.
    counter.assumeIsolated { $0.bump() }
    Queue.global().apply(8) { _ in counter.assumeIsolated { $0.bump() } }
  }
  exit(0)
}

private let reentrantFunctionQueue = Queue(label: "isolation.f.reentrant")

private func syncOntoReentrantFunctionQueue(_ context: UnsafeMutableRawPointer?) {
  reentrantFunctionQueue.sync {}
  Unmanaged<Event>.fromOpaque(context!).takeUnretainedValue().signal()
}

private func syncFromInsideFunctionWorkOnItsQueue() {
  let survived = Event()
  reentrantFunctionQueue.async(
    context: Unmanaged.passUnretained(survived).toOpaque(), function: syncOntoReentrantFunctionQueue)
  exitIfSurvived(waitingFor: survived)
}
