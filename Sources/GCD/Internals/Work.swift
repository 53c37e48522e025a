import CDispatch
import CGCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// A closure on its way through a `_f` C function: one `malloc`, like the
/// heap copy of a C block, carrying the closure, the queue it runs on (for
/// the re-entrancy frames) and, for group work, the group to leave.
///
/// A plain record in malloc'd memory rather than a class instance: the
/// closure is moved in and moved out, so the trip costs one allocation, one
/// retain of the closure's context (the copy C's `Block_copy` makes too) and
/// one release, with no reference counting of a box (measured with
/// callgrind: ~130 instructions less per `async` than a class box).
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
    _ body: @escaping @Sendable () -> Void, queue: OpaquePointer, flags: UInt, group: Group? = nil
  ) -> UnsafeMutableRawPointer {
    guard let memory = malloc(MemoryLayout<Work>.stride) else {
      fatalError("GCD: out of memory for a work item")
    }
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
    free(memory)
    // A closure that calls the stored one: passing `work.body` itself would
    // copy it (a retain and a release per work item).
    withFrame(queue: work.queue, flags: work.flags, prev: cgcd_frame_get()) { work.body() }
    work.group?.leave()
  }
}

/// Frame flag: the frame holds its queue exclusively (serial queue or barrier).
@usableFromInline let frameExclusive: UInt = 1

/// Runs `body` with a frame for `queue` pushed on this thread's chain, linked
/// to `prev` (the caller's chain for `sync` and `apply`, this thread's own
/// otherwise), and restores the thread's chain afterwards.
///
/// Not generic and not `rethrows`: a closure passed as `() throws -> R`
/// would be wrapped in a reabstraction thunk, and the stored closure copied
/// (retained and released) on every call.
@inlinable
func withFrame(
  queue: OpaquePointer, flags: UInt, prev: UnsafeMutablePointer<cgcd_frame_t>?, _ body: () -> Void
) {
  let saved = cgcd_frame_get()
  var frame = cgcd_frame_t(queue: queue.raw, flags: flags, prev: prev)
  withUnsafeMutablePointer(to: &frame) { frame in
    cgcd_frame_set(frame)
    body()
    cgcd_frame_set(saved)
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
