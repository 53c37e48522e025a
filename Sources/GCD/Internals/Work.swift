import CDispatch
import CGCD

/// A closure on its way through a `_f` C function: one allocation, like the
/// heap copy of a C block, carrying the closure, the queue it runs on (for
/// the re-entrancy frames) and, for group work, the group to leave.
@usableFromInline
final class Work: @unchecked Sendable {
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

  /// Retained, as the context pointer of a `_f` call; `run` takes it back.
  @inlinable
  var retainedContext: UnsafeMutableRawPointer { Unmanaged.passRetained(self).toOpaque() }

  /// The body of the trampoline of every closure submitted through a `_f`
  /// function: takes back the retained context, runs the closure inside a
  /// frame, leaves the group (before the last reference to it can go).
  @inlinable
  static func run(_ context: UnsafeMutableRawPointer?) {
    let work = Unmanaged<Work>.fromOpaque(context.unsafelyUnwrapped).takeRetainedValue()
    withFrame(queue: work.queue, flags: work.flags, prev: cgcd_frame_get(), work.body)
    work.group?.leave()
  }
}

/// Frame flag: the frame holds its queue exclusively (serial queue or barrier).
@usableFromInline let frameExclusive: UInt = 1

/// Runs `body` with a frame for `queue` pushed on this thread's chain, linked
/// to `prev` (the caller's chain for `sync` and `apply`, this thread's own
/// otherwise), and restores the thread's chain afterwards.
@inlinable
func withFrame<R>(queue: OpaquePointer, flags: UInt, prev: UnsafeMutablePointer<cgcd_frame_t>?, _ body: () throws -> R)
  rethrows -> R
{
  let saved = cgcd_frame_get()
  var frame = cgcd_frame_t(queue: queue.raw, flags: flags, prev: prev)
  defer { cgcd_frame_set(saved) }
  return try withUnsafeMutablePointer(to: &frame) { frame in
    cgcd_frame_set(frame)
    return try body()
  }
}

/// A C function and its context submitted as group work: holds the group,
/// like `Work`, so that a group is never dropped while its work is pending.
@usableFromInline
final class GroupFunctionWork: @unchecked Sendable {
  @usableFromInline let group: Group
  @usableFromInline let context: UnsafeMutableRawPointer?
  @usableFromInline let function: @convention(c) (UnsafeMutableRawPointer?) -> Void

  @inlinable
  init(
    group: Group, context: UnsafeMutableRawPointer?, function: @convention(c) (UnsafeMutableRawPointer?) -> Void
  ) {
    self.group = group
    self.context = context
    self.function = function
  }

  @inlinable
  static func run(_ context: UnsafeMutableRawPointer?) {
    let work = Unmanaged<GroupFunctionWork>.fromOpaque(context.unsafelyUnwrapped).takeRetainedValue()
    work.function(work.context)
    work.group.leave()
  }
}
