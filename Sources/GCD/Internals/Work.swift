/// A closure on its way through a `_f` C function: one `malloc`, like the
/// heap copy of a C block, carrying the closure, the queue it runs on (for
/// its frame) and, for group work, the group to leave.
///
/// A plain record in malloc'd memory rather than a class instance: the
/// closure is moved in and moved out, so the trip costs one allocation, one
/// retain of the closure's context (the copy C's `Block_copy` makes too) and
/// one release, and no reference counting of a box.
@usableFromInline
struct Work {
  @usableFromInline let body: @Sendable () -> Void
  @usableFromInline let queue: OpaquePointer
  @usableFromInline let flags: UInt
  @usableFromInline let group: Group?

  @inlinable
  init(_ body: @escaping @Sendable () -> Void, queue: OpaquePointer, flags: UInt, group: Group? = nil) {
    self.body = body
    self.queue = queue
    self.flags = flags
    self.group = group
  }

  /// A new record in malloc'd memory, as the context pointer of a `_f`
  /// call; `run` takes it back and frees it.
  @inlinable
  static func context(
    _ body: @escaping @Sendable () -> Void, queue: OpaquePointer, flags: UInt, group: Group? = nil,
    extraBytes: Int = 0
  ) -> UnsafeMutableRawPointer {
    let memory = system_malloc(MemoryLayout<Work>.stride + extraBytes)
    memory.assumingMemoryBound(to: Work.self).initialize(
      to: Work(body, queue: queue, flags: flags, group: group))
    return memory
  }

  /// The body of the trampoline of every closure submitted through a `_f`
  /// function: takes back the record, runs the closure inside a frame,
  /// leaves the group (before the last reference to it can go).
  @inlinable
  static func run(_ context: UnsafeMutableRawPointer?) {
    let memory = context.unsafelyUnwrapped
    let work = memory.assumingMemoryBound(to: Work.self).move()
    system_free(memory)
    // A closure that calls the stored one: passing `work.body` itself would
    // copy it (a retain and a release per work item).
    withUnwatchedFrame(queue: work.queue, flags: work.flags) { work.body() }
    work.group?.leave()
  }

  /// `context` while a `StallMonitor` watches: the record carries the submission's time after
  /// the work (for the queue's wait time), and the submission is counted.
  @usableFromInline
  @inline(never)
  static func watchedContext(
    _ body: @escaping @Sendable () -> Void, queue: OpaquePointer, flags: UInt, group: Group? = nil
  ) -> UnsafeMutableRawPointer {
    stallSubmitted(queue)
    let memory = context(body, queue: queue, flags: flags, group: group, extraBytes: MemoryLayout<UInt64>.size)
    (memory + MemoryLayout<Work>.stride).storeBytes(of: stallNow, as: UInt64.self)
    return memory
  }

  /// `run` for a record made by `watchedContext`: the work is recorded for the monitor.
  @usableFromInline
  static func runWatched(_ context: UnsafeMutableRawPointer?) {
    let memory = context.unsafelyUnwrapped
    let work = memory.assumingMemoryBound(to: Work.self).move()
    let submitted = (memory + MemoryLayout<Work>.stride).load(as: UInt64.self)
    system_free(memory)
    withWatchedFrame(queue: work.queue, flags: work.flags, site: stallSite(work.body), submitted: submitted) {
      work.body()
    }
    work.group?.leave()
  }
}

/// A C function and its context submitted as group work: holds the group,
/// like `Work`, so that a group is never dropped while its work is pending,
/// and runs the function inside a frame for its queue.
@usableFromInline
final class GroupFunctionWork: @unchecked Sendable {  // immutable; the context is the caller's to make safe, as in C
  @usableFromInline let group: Group
  @usableFromInline let context: UnsafeMutableRawPointer?
  @usableFromInline let function: Libdispatch.Function
  @usableFromInline let queue: OpaquePointer
  @usableFromInline let flags: UInt

  @inlinable
  init(group: Group, context: UnsafeMutableRawPointer?, function: Libdispatch.Function, queue: Queue) {
    self.group = group
    self.context = context
    self.function = function
    self.queue = queue.raw
    self.flags = queue.flags
  }

  @inlinable
  static func run(_ context: UnsafeMutableRawPointer?) {
    let work = Unmanaged<GroupFunctionWork>.fromOpaque(context.unsafelyUnwrapped).takeRetainedValue()
    withFrame(queue: work.queue, flags: work.flags) { work.function(work.context) }
    work.group.leave()
  }
}
