// Every queue is a TaskExecutor; SerialQueue (SerialQueue.swift) is also a
// SerialExecutor. Jobs travel through dispatch_async_f with the job as the
// context, as the Swift runtime's own global executor sends them on Linux,
// and run inside a frame for the queue (Internals/Frames.swift) so that
// `isCurrent` and `Queue.precondition` see them.

extension Queue: TaskExecutor {
  /// Submits a job of a task that prefers this queue (or of an actor that
  /// runs on this `SerialQueue`): `dispatch_async_f` with the job as the
  /// context, no allocation. The Swift runtime calls this; you do not.
  ///
  /// - Parameter job: The job to run.
  ///
  /// The corresponding C function is `dispatch_async_f`.
  public final func enqueue(_ job: consuming ExecutorJob) {
    let context = unsafeBitCast(UnownedJob(job), to: UnsafeMutableRawPointer.self)
    if flags & Queue.serialExecutorFlag != 0 {
      Libdispatch.async_f(raw, context) { JobRunner.run($0) }
    } else if flags & Queue.globalFlag != 0 && flags & Queue.mainFlag == 0 {
      // libdispatch keeps no queue-specific values on global queues: one runner per global queue.
      Libdispatch.async_f(raw, context, JobRunner.globalRunner(raw))
    } else {
      JobRunner.register(self)
      Libdispatch.async_f(raw, context) { JobRunner.run($0) }
    }
  }
}

/// Runs the jobs `Queue.enqueue` submits.
enum JobRunner {
  /// Records `queue` as the executor of its C queue, once.
  static func register(_ queue: Queue) {
    if Libdispatch.queue_get_specific(queue.raw, Libdispatch.executorKey) == nil {
      Libdispatch.queue_set_specific(
        queue.raw, Libdispatch.executorKey, Unmanaged.passUnretained(queue).toOpaque(), nil)
    }
  }

  /// The runner of a job on a created queue, or the main queue: finds the
  /// queue's wrapper from the queue (`Libdispatch.executorKey`).
  static func run(_ context: UnsafeMutableRawPointer?) {
    guard let wrapper = Libdispatch.get_specific(Libdispatch.executorKey) else {
      fatalError("GCD: an executor job runs on a queue that has no executor record")
    }
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
