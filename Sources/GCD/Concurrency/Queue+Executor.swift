// Every queue is a TaskExecutor; SerialQueue (SerialQueue.swift) is also a
// SerialExecutor. Jobs travel through dispatch_async_f with the job as the
// context, as the Swift runtime's own global executor sends them on Linux,
// and run inside a frame for the queue (Internals/Frames.swift) so that
// `isCurrent` and `Queue.precondition` see them.
//
// The runner finds the queue's wrapper in the job itself: the two words a job
// keeps for the executor that holds it (`withUnsafeExecutorPrivateData`, the
// toolchain's `ExperimentalCustomExecutors` interface), written by `enqueue`.
// A queue-specific value would cost every executor queue libdispatch's list
// and entry (two allocations, 80 bytes: docs/performance.md, `actors_on_queues`).

import Synchronization
@_spi(ExperimentalCustomExecutors) import _Concurrency

extension Queue: TaskExecutor {
  /// Submits a job of a task that prefers this queue (or of an actor that
  /// runs on this `SerialQueue`): `dispatch_async_f` with the job as the
  /// context, no allocation. The Swift runtime calls this; you do not.
  ///
  /// - Parameter job: The job to run.
  ///
  /// The corresponding C function is `dispatch_async_f`.
  public final func enqueue(_ job: consuming ExecutorJob) {
    if flags & Queue.globalFlag != 0 && flags & Queue.mainFlag == 0 {
      // A global queue's runner knows its wrapper.
      let context = unsafeBitCast(UnownedJob(job), to: UnsafeMutableRawPointer.self)
      Libdispatch.async_f(raw, context, JobRunner.globalRunner(raw))
      return
    }
    let context = unsafeBitCast(UnownedJob(job), to: UnsafeMutableRawPointer.self)
    var offset = JobRunner.privateOffset.load(ordering: .relaxed)
    if offset < 0 { offset = JobRunner.measurePrivateOffset(context) }
    // Unretained: the jobs of a queue run while its wrapper is alive, like any executor's.
    (context + offset).storeBytes(of: Unmanaged.passUnretained(self).toOpaque(), as: UnsafeMutableRawPointer.self)
    Libdispatch.async_f(raw, context) { JobRunner.run($0) }
  }
}

/// Runs the jobs `Queue.enqueue` submits.
enum JobRunner {
  /// Where a job keeps the two words for the executor that holds it, from the job's address: the
  /// address `withUnsafeExecutorPrivateData` gives for the first job, less the job's (the same for
  /// every job of the process: a field of the runtime's job header). Kept so that each job costs a
  /// store and a load, not two generic calls into the runtime (107 instructions an actor hop,
  /// `Benchmarks/callgrind.sh actor_hop`). -1 until the first job; relaxed: every thread that
  /// measures stores the same value, and a runner reads it after its job's `enqueue` wrote it
  /// (`dispatch_async_f` orders the two).
  static let privateOffset = Atomic<Int>(-1)

  /// Measures `privateOffset` on the job at `context` (the first one enqueued), checking that the words are in
  /// the job and hold a pointer.
  static func measurePrivateOffset(_ context: UnsafeMutableRawPointer) -> Int {
    let job = ExecutorJob(unsafeBitCast(context, to: UnownedJob.self))
    let (base, count) = job.withUnsafeExecutorPrivateData { ($0.baseAddress, $0.count) }
    guard let base, count >= MemoryLayout<UnsafeMutableRawPointer>.size, base >= context else {
      fatalError("GCD: the Swift runtime gives a job no executor-private words (\(count) bytes)")
    }
    let offset = base - context
    privateOffset.store(offset, ordering: .relaxed)
    return offset
  }

  /// The runner of a job on a created queue, or the main queue: finds the queue's wrapper in the
  /// job's executor-private words, where `enqueue` wrote it.
  static func run(_ context: UnsafeMutableRawPointer?) {
    let job = context.unsafelyUnwrapped
    let wrapper = (job + privateOffset.load(ordering: .relaxed)).load(as: UnsafeMutableRawPointer.self)
    run(context, on: Unmanaged<Queue>.fromOpaque(wrapper).takeUnretainedValue())
  }

  /// Runs the job in `context` on `queue`'s thread, inside a frame for the
  /// queue: isolated to it and with it as the task executor for a
  /// `SerialQueue`, with it as the task executor otherwise.
  static func run(_ context: UnsafeMutableRawPointer?, on queue: Queue) {
    let job = unsafeBitCast(context.unsafelyUnwrapped, to: UnownedJob.self)
    withFrame(queue: queue.raw, flags: queue.flags) {
      if queue.flags & Queue.serialExecutorFlag != 0 {
        let serial = unsafeDowncast(queue, to: SerialQueue.self)
        job.runSynchronously(isolatedTo: serial.asUnownedSerialExecutor(), taskExecutor: serial.asUnownedTaskExecutor())
      } else {
        job.runSynchronously(on: queue.asUnownedTaskExecutor())
      }
    }
  }

  /// The runner for a global queue, which knows its wrapper.
  static func globalRunner(_ raw: OpaquePointer) -> Libdispatch.Function {
    switch raw {
    case Queue.global(.high).raw: { JobRunner.run($0, on: Queue.global(.high)) }
    case Queue.global(.low).raw: { JobRunner.run($0, on: Queue.global(.low)) }
    case Queue.global(.background).raw: { JobRunner.run($0, on: Queue.global(.background)) }
    default: { JobRunner.run($0, on: Queue.global(.default)) }
    }
  }
}
