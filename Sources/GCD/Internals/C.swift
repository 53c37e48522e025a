import CDispatch
import CGCD

/// The libdispatch calls the package makes: the one Swift file that names a
/// libdispatch function (Syscalls.swift is its twin for the C library).
///
/// Each member is named after its C function less the `dispatch_` prefix
/// and only calls it: inlinable, no logic, so a wrapper's call compiles to
/// the C call itself. Objects are passed as the `OpaquePointer` a wrapper
/// holds.
@usableFromInline
enum Libdispatch {
  /// The C function taking a context, as the `_f` calls want it.
  @usableFromInline typealias Function = @convention(c) (UnsafeMutableRawPointer?) -> Void

  // MARK: Objects

  /// `dispatch_retain` (through CGCD: Swift marks it unavailable).
  @inlinable static func retain(_ object: OpaquePointer) { cgcd_retain(UnsafeMutableRawPointer(object)) }
  /// `dispatch_release` (through CGCD: Swift marks it unavailable).
  @inlinable static func release(_ object: OpaquePointer) { cgcd_release(UnsafeMutableRawPointer(object)) }
  @inlinable static func activate(_ object: OpaquePointer) { dispatch_activate(dispatch_object_t(_do: object)) }
  @inlinable static func suspend(_ object: OpaquePointer) { dispatch_suspend(dispatch_object_t(_do: object)) }
  @inlinable static func resume(_ object: OpaquePointer) { dispatch_resume(dispatch_object_t(_do: object)) }
  @inlinable static func get_context(_ object: OpaquePointer) -> UnsafeMutableRawPointer? {
    dispatch_get_context(dispatch_object_t(_do: object))
  }
  @inlinable static func set_context(_ object: OpaquePointer, _ context: UnsafeMutableRawPointer?) {
    dispatch_set_context(dispatch_object_t(_do: object), context)
  }
  @inlinable static func set_finalizer_f(_ object: OpaquePointer, _ finalizer: Function?) {
    dispatch_set_finalizer_f(dispatch_object_t(_do: object), finalizer)
  }
  @inlinable static func set_target_queue(_ object: OpaquePointer, _ queue: OpaquePointer) {
    dispatch_set_target_queue(dispatch_object_t(_do: object), queue)
  }

  // MARK: Queues

  /// `DISPATCH_QUEUE_CONCURRENT` (a macro over an incomplete global, through CGCD).
  @inlinable static var queue_attr_concurrent: OpaquePointer { OpaquePointer(cgcd_queue_attr_concurrent()) }
  @inlinable static func queue_attr_make_with_qos_class(_ attr: OpaquePointer?, _ qos: UInt32, _ relative: Int32)
    -> OpaquePointer?
  {
    dispatch_queue_attr_make_with_qos_class(attr, qos, relative)
  }
  @inlinable static func queue_attr_make_initially_inactive(_ attr: OpaquePointer?) -> OpaquePointer? {
    dispatch_queue_attr_make_initially_inactive(attr)
  }
  @inlinable static func queue_create(_ label: UnsafePointer<CChar>, _ attr: OpaquePointer?) -> OpaquePointer {
    dispatch_queue_create(label, attr)
  }
  @inlinable static func get_main_queue() -> OpaquePointer { dispatch_get_main_queue() }
  @inlinable static func get_global_queue(_ identifier: Int) -> OpaquePointer {
    dispatch_get_global_queue(identifier, 0)
  }
  @inlinable static func queue_get_label(_ queue: OpaquePointer) -> UnsafePointer<CChar> {
    dispatch_queue_get_label(queue)
  }
  @inlinable static func queue_get_qos_class(_ queue: OpaquePointer) -> (UInt32, Int32) {
    var relative: Int32 = 0
    let qos = dispatch_queue_get_qos_class(queue, &relative)
    return (qos, relative)
  }
  @inlinable static func async_f(_ queue: OpaquePointer, _ context: UnsafeMutableRawPointer?, _ work: Function) {
    dispatch_async_f(queue, context, work)
  }
  @inlinable static func barrier_async_f(_ queue: OpaquePointer, _ context: UnsafeMutableRawPointer?, _ work: Function)
  {
    dispatch_barrier_async_f(queue, context, work)
  }
  @inlinable static func after_f(
    _ when: UInt64, _ queue: OpaquePointer, _ context: UnsafeMutableRawPointer?, _ work: Function
  ) {
    dispatch_after_f(when, queue, context, work)
  }
  @inlinable static func queue_get_specific(_ queue: OpaquePointer, _ key: UnsafeRawPointer) -> UnsafeMutableRawPointer?
  {
    dispatch_queue_get_specific(queue, key)
  }
  @inlinable static func queue_set_specific(
    _ queue: OpaquePointer, _ key: UnsafeRawPointer, _ value: UnsafeMutableRawPointer?, _ destructor: Function?
  ) {
    dispatch_queue_set_specific(queue, key, value, destructor)
  }
  @inlinable static func get_specific(_ key: UnsafeRawPointer) -> UnsafeMutableRawPointer? {
    dispatch_get_specific(key)
  }

  /// The keys under which the package records, on the queues it re-targets,
  /// the target (`targetKey`: its address, bit 0 set for a serial target)
  /// and the list of targets it keeps alive (`targetsKey`), and marks the
  /// main queue (`mainQueueKey`). Distinct bytes of one CGCD global, so unique.
  @inlinable static var targetKey: UnsafeRawPointer { cgcd_key(CGCD_KEY_TARGET) }
  @inlinable static var targetsKey: UnsafeRawPointer { cgcd_key(CGCD_KEY_TARGETS) }
  @inlinable static var mainQueueKey: UnsafeRawPointer { cgcd_key(CGCD_KEY_MAIN_QUEUE) }

  /// The key that marks the queue sources register on (`Registration.queue`).
  static var registrationKey: UnsafeRawPointer { cgcd_key(CGCD_KEY_REGISTRATION) }

  /// `dispatch_get_current_queue`: the queue whose work the calling thread
  /// is running (the queue the work was submitted to, or a global queue);
  /// libdispatch's own record, which also sees work this package did not
  /// wrap (`_f` calls). Through CGCD: the header marks it deprecated.
  static func get_current_queue() -> OpaquePointer? { cgcd_get_current_queue().map(OpaquePointer.init) }

  /// `dispatch_assert_queue_barrier`: returns when the calling thread runs
  /// work of `queue` as a barrier; otherwise libdispatch stops the process.
  static func assert_queue_barrier(_ queue: OpaquePointer) { dispatch_assert_queue_barrier(queue) }

  /// Whether the calling thread is the process's main thread (CGCD: `gettid() == getpid()`, cached per thread).
  @inlinable static var isMainThread: Bool { cgcd_is_main_thread() != 0 }

  /// Drains the main queue on the calling thread forever, the way a run
  /// loop does: waits on the main queue's wake-up descriptor and runs the
  /// queued work (libdispatch's run-loop interface, through CGCD; see
  /// `Queue.dispatchMain()`).
  static func drainMainQueueForever() -> Never {
    let descriptor = cgcd_main_queue_handle()
    var count: UInt64 = 0
    while true {
      guard system_waitReadable(descriptor) else {
        fatalError("GCD: Queue.dispatchMain(): poll on the main queue's descriptor failed (errno \(system_errno))")
      }
      _ = system_read(descriptor, &count, MemoryLayout<UInt64>.size)  // resets the eventfd; EAGAIN is fine
      cgcd_main_queue_callback(nil)
    }
  }

  // MARK: Groups and semaphores

  @inlinable static func group_create() -> OpaquePointer { dispatch_group_create() }
  @inlinable static func group_enter(_ group: OpaquePointer) { dispatch_group_enter(group) }
  @inlinable static func group_leave(_ group: OpaquePointer) { dispatch_group_leave(group) }
  /// 0 when the group is empty, non-zero on timeout.
  @inlinable static func group_wait(_ group: OpaquePointer, _ timeout: UInt64) -> Int {
    dispatch_group_wait(group, timeout)
  }
  @inlinable static func group_notify_f(
    _ group: OpaquePointer, _ queue: OpaquePointer, _ context: UnsafeMutableRawPointer?, _ work: Function
  ) {
    dispatch_group_notify_f(group, queue, context, work)
  }
  @inlinable static func semaphore_create(_ value: Int) -> OpaquePointer { dispatch_semaphore_create(value) }
  /// Non-zero when a waiting thread was woken.
  @inlinable static func semaphore_signal(_ semaphore: OpaquePointer) -> Int { dispatch_semaphore_signal(semaphore) }
  /// 0 when a unit was taken, non-zero on timeout.
  @inlinable static func semaphore_wait(_ semaphore: OpaquePointer, _ timeout: UInt64) -> Int {
    dispatch_semaphore_wait(semaphore, timeout)
  }

  // MARK: Dispatch blocks

  /// A block as libdispatch makes and takes it.
  typealias Block = @convention(block) () -> Void

  /// `dispatch_block_create_with_qos_class` (through CGCD, so the block
  /// keeps its identity and flags); nil for flags, a class or a relative
  /// priority libdispatch rejects.
  static func block_create_with_qos_class(_ flags: UInt, _ qos: UInt32, _ relative: Int32, _ body: @escaping Block)
    -> Block?
  {
    cgcd_block_create_with_qos_class(flags, qos, relative, body)
  }
  /// `dispatch_async` of a block made by `block_create_with_qos_class`.
  static func async_block(_ queue: OpaquePointer, _ block: @escaping Block) {
    cgcd_async_block(UnsafeMutableRawPointer(queue), block)
  }
  /// `dispatch_barrier_async` of a block made by `block_create_with_qos_class`.
  static func barrier_async_block(_ queue: OpaquePointer, _ block: @escaping Block) {
    cgcd_barrier_async_block(UnsafeMutableRawPointer(queue), block)
  }
  /// `dispatch_after` of a block made by `block_create_with_qos_class`.
  static func after_block(_ when: UInt64, _ queue: OpaquePointer, _ block: @escaping Block) {
    cgcd_after_block(when, UnsafeMutableRawPointer(queue), block)
  }

  // MARK: Time

  /// `DISPATCH_TIME_FOREVER`.
  @usableFromInline static let timeForever: UInt64 = ~0
  /// `DISPATCH_TIME_MAX_VALUE` (src/shims/time.h): libdispatch's clocks count up to 2^62 − 1 ns; a
  /// result at or past it is `DISPATCH_TIME_FOREVER`.
  @usableFromInline static let timeMaxValue: UInt64 = 1 << 62 - 1
  /// `DISPATCH_WALLTIME_NOW` (`~1`): the current wall-clock time, read when libdispatch uses it.
  @usableFromInline static let walltimeNow: UInt64 = ~1
  @inlinable static func time(_ base: UInt64, _ delta: Int64) -> UInt64 { dispatch_time(base, delta) }
  /// `dispatch_walltime(NULL, delta)`: now on the wall clock.
  @inlinable static func walltime(_ delta: Int64) -> UInt64 { dispatch_walltime(nil, delta) }
  /// `dispatch_walltime(&{seconds, nanoseconds}, 0)`.
  static func walltime(seconds: Int, nanoseconds: Int) -> UInt64 {
    var spec = timespec(tv_sec: seconds, tv_nsec: nanoseconds)
    return dispatch_walltime(&spec, 0)
  }

  // MARK: Sources

  /// The source types (`DISPATCH_SOURCE_TYPE_*`: addresses of exported
  /// structures, which only C can take, through CGCD).
  @usableFromInline
  enum SourceType {
    case dataAdd, dataOr, dataReplace, read, write, signal, timer

    @usableFromInline var pointer: UnsafeRawPointer {
      switch self {
      case .dataAdd: cgcd_source_type_data_add()
      case .dataOr: cgcd_source_type_data_or()
      case .dataReplace: cgcd_source_type_data_replace()
      case .read: cgcd_source_type_read()
      case .write: cgcd_source_type_write()
      case .signal: cgcd_source_type_signal()
      case .timer: cgcd_source_type_timer()
      }
    }
  }

  /// nil when libdispatch rejects the handle or the mask (CGCD declares the
  /// result nullable; Swift's import of the header does not).
  static func source_create(_ type: SourceType, _ handle: UInt, _ mask: UInt, _ queue: OpaquePointer?)
    -> OpaquePointer?
  {
    cgcd_source_create(type.pointer, handle, mask, queue.map(UnsafeMutableRawPointer.init)).map(OpaquePointer.init)
  }
  @inlinable static func source_get_data(_ source: OpaquePointer) -> UInt { dispatch_source_get_data(source) }
  @inlinable static func source_get_mask(_ source: OpaquePointer) -> UInt { dispatch_source_get_mask(source) }
  @inlinable static func source_get_handle(_ source: OpaquePointer) -> UInt { dispatch_source_get_handle(source) }
  @inlinable static func source_merge_data(_ source: OpaquePointer, _ value: UInt) {
    dispatch_source_merge_data(source, value)
  }
  @inlinable static func source_cancel(_ source: OpaquePointer) { dispatch_source_cancel(source) }
  @inlinable static func source_testcancel(_ source: OpaquePointer) -> Bool { dispatch_source_testcancel(source) != 0 }
  @inlinable static func source_set_timer(
    _ source: OpaquePointer, _ start: UInt64, _ interval: UInt64, _ leeway: UInt64
  ) {
    dispatch_source_set_timer(source, start, interval, leeway)
  }
  static func source_set_event_handler(_ source: OpaquePointer, _ handler: @escaping Block) {
    withExtendedLifetime(handler) {
      cgcd_source_set_event_handler(UnsafeMutableRawPointer(source), blockPointer(handler))
    }
  }
  /// Sets an event handler block that holds `context` alone and calls `invoke` with itself;
  /// `block_context` reads `context` back (`cgcd_source_set_context_handler`: 40 bytes, not the 48
  /// of a block made from a closure). The block does not retain `context`.
  static func source_set_context_handler(
    _ source: OpaquePointer, _ context: UnsafeMutableRawPointer,
    _ invoke: @convention(c) (UnsafeMutableRawPointer) -> Void
  ) {
    cgcd_source_set_context_handler(UnsafeMutableRawPointer(source), invoke, context)
  }
  /// The pointer a block of `source_set_context_handler` holds.
  @inline(__always) static func block_context(_ block: UnsafeMutableRawPointer) -> UnsafeMutableRawPointer {
    cgcd_block_context(block)
  }
  static func source_set_registration_handler(_ source: OpaquePointer, _ handler: @escaping Block) {
    withExtendedLifetime(handler) {
      cgcd_source_set_registration_handler(UnsafeMutableRawPointer(source), blockPointer(handler))
    }
  }
  static func source_set_cancel_handler(_ source: OpaquePointer, _ handler: @escaping Block) {
    withExtendedLifetime(handler) {
      cgcd_source_set_cancel_handler(UnsafeMutableRawPointer(source), blockPointer(handler))
    }
  }
  /// The block itself, as the pointer it is (unretained: the caller keeps `block` alive across the
  /// C call, which copies it).
  @inline(__always)
  static func blockPointer(_ block: @escaping Block) -> UnsafeMutableRawPointer {
    unsafeBitCast(block, to: UnsafeMutableRawPointer.self)
  }
}

// MARK: - Data and I/O channels

extension Libdispatch {
  /// `dispatch_data_applier_function_t`, `dispatch_io_handler_function_t`
  /// and the cleanup of the `_f` channel constructors (declared through CGCD).
  @usableFromInline typealias DataApplier = cgcd_data_applier_t
  @usableFromInline typealias IOHandler = cgcd_io_handler_t
  @usableFromInline typealias IOCleanup = cgcd_io_cleanup_t

  /// `DISPATCH_IO_STREAM`, `DISPATCH_IO_RANDOM`, `DISPATCH_IO_STOP`, `DISPATCH_IO_STRICT_INTERVAL`.
  static let ioStream: UInt = UInt(DISPATCH_IO_STREAM)
  static let ioRandom: UInt = UInt(DISPATCH_IO_RANDOM)
  static let ioStop: UInt = UInt(DISPATCH_IO_STOP)
  static let ioStrictInterval: UInt = UInt(DISPATCH_IO_STRICT_INTERVAL)

  /// `dispatch_data_empty` (a global object: retain and release are no-ops).
  @inlinable static var data_empty: OpaquePointer { OpaquePointer(cgcd_data_empty()) }
  /// `DISPATCH_DATA_DESTRUCTOR_FREE` / `_MUNMAP`, by identity.
  static var data_destructor_free: UnsafeRawPointer { cgcd_data_destructor_free }
  static var data_destructor_munmap: UnsafeRawPointer { cgcd_data_destructor_munmap }

  /// `dispatch_data_create` with a recognized destructor (nil: copy the bytes).
  @inlinable static func data_create(
    _ buffer: UnsafeRawPointer?, _ size: Int, _ queue: OpaquePointer?, destructor: UnsafeRawPointer?
  ) -> OpaquePointer {
    OpaquePointer(cgcd_data_create(buffer, size, queue.map(UnsafeMutableRawPointer.init), destructor))
  }
  /// `dispatch_data_create` with a destructor block (Swift makes the block).
  static func data_create(
    _ buffer: UnsafeRawPointer, _ size: Int, _ queue: OpaquePointer?, block: @escaping () -> Void
  ) -> OpaquePointer {
    dispatch_data_create(buffer, size, queue, block)
  }
  @inlinable static func data_get_size(_ data: OpaquePointer) -> Int { dispatch_data_get_size(data) }
  @inlinable static func data_create_concat(_ first: OpaquePointer, _ second: OpaquePointer) -> OpaquePointer {
    dispatch_data_create_concat(first, second)
  }
  @inlinable static func data_create_subrange(_ data: OpaquePointer, _ offset: Int, _ length: Int) -> OpaquePointer {
    dispatch_data_create_subrange(data, offset, length)
  }
  @inlinable static func data_create_map(
    _ data: OpaquePointer, _ buffer: UnsafeMutablePointer<UnsafeRawPointer?>, _ size: UnsafeMutablePointer<Int>
  ) -> OpaquePointer {
    dispatch_data_create_map(data, buffer, size)
  }
  @inlinable static func data_apply_f(
    _ data: OpaquePointer, _ context: UnsafeMutableRawPointer?, _ applier: DataApplier
  )
    -> Bool
  {
    cgcd_data_apply_f(UnsafeMutableRawPointer(data), context, applier)
  }
  /// `dispatch_data_apply_f` with CGCD's copying applier (`cgcd_data_copy_out`).
  static func data_copy_out(
    _ data: OpaquePointer, _ target: UnsafeMutableRawPointer, _ start: Int, _ end: Int, total: Int
  ) {
    cgcd_data_copy_out(UnsafeMutableRawPointer(data), target, start, end, total)
  }

  static func io_create_f(
    _ type: UInt, _ descriptor: Int32, _ queue: OpaquePointer, _ context: UnsafeMutableRawPointer?,
    _ cleanup: IOCleanup
  ) -> OpaquePointer? {
    cgcd_io_create_f(type, descriptor, UnsafeMutableRawPointer(queue), context, cleanup).map(OpaquePointer.init)
  }
  static func io_create_with_io_f(
    _ type: UInt, _ channel: OpaquePointer, _ queue: OpaquePointer, _ context: UnsafeMutableRawPointer?,
    _ cleanup: IOCleanup
  ) -> OpaquePointer? {
    cgcd_io_create_with_io_f(
      type, UnsafeMutableRawPointer(channel), UnsafeMutableRawPointer(queue), context, cleanup
    ).map(OpaquePointer.init)
  }
  @inlinable static func io_read_f(
    _ channel: OpaquePointer, _ offset: Int, _ length: Int, _ queue: OpaquePointer,
    _ context: UnsafeMutableRawPointer?, _ handler: IOHandler
  ) {
    cgcd_io_read_f(UnsafeMutableRawPointer(channel), offset, length, UnsafeMutableRawPointer(queue), context, handler)
  }
  @inlinable static func io_write_f(
    _ channel: OpaquePointer, _ offset: Int, _ data: OpaquePointer, _ queue: OpaquePointer,
    _ context: UnsafeMutableRawPointer?, _ handler: IOHandler
  ) {
    cgcd_io_write_f(
      UnsafeMutableRawPointer(channel), offset, UnsafeMutableRawPointer(data), UnsafeMutableRawPointer(queue),
      context, handler)
  }
  static func io_barrier_f(_ channel: OpaquePointer, _ context: UnsafeMutableRawPointer?, _ barrier: Function) {
    cgcd_io_barrier_f(UnsafeMutableRawPointer(channel), context, barrier)
  }
  static func io_close(_ channel: OpaquePointer, _ flags: UInt) { dispatch_io_close(channel, flags) }
  static func io_get_descriptor(_ channel: OpaquePointer) -> Int32 { dispatch_io_get_descriptor(channel) }
  static func io_set_low_water(_ channel: OpaquePointer, _ value: Int) { dispatch_io_set_low_water(channel, value) }
  static func io_set_high_water(_ channel: OpaquePointer, _ value: Int) { dispatch_io_set_high_water(channel, value) }
  static func io_set_interval(_ channel: OpaquePointer, _ interval: UInt64, _ flags: UInt) {
    dispatch_io_set_interval(channel, interval, flags)
  }

  // MARK: The function forms inside a frame (CGCD.c)

  /// `dispatch_sync_f` / `dispatch_barrier_sync_f` of `work` inside a frame
  /// for `queue` linked to the caller's chain.
  @inlinable static func syncInFrame(
    _ queue: OpaquePointer, _ flags: UInt, barrier: Bool, _ context: UnsafeMutableRawPointer?, _ work: Function
  ) {
    cgcd_sync_function(UnsafeMutableRawPointer(queue), flags, barrier ? 1 : 0, context, work)
  }
  /// `dispatch_async_and_wait_f` / `dispatch_barrier_async_and_wait_f` of `work`, inside a frame
  /// for `queue` linked to the caller's chain.
  @inlinable static func asyncAndWaitInFrame(
    _ queue: OpaquePointer, _ flags: UInt, barrier: Bool, _ context: UnsafeMutableRawPointer?, _ work: Function
  ) {
    cgcd_async_and_wait_function(UnsafeMutableRawPointer(queue), flags, barrier ? 1 : 0, context, work)
  }
  /// `syncInFrame` for a thread with no frame, onto a queue whose work runs on the calling thread.
  @inlinable static func syncInFrameHere(
    _ queue: OpaquePointer, _ flags: UInt, barrier: Bool, _ context: UnsafeMutableRawPointer?, _ work: Function
  ) {
    cgcd_sync_function_here(UnsafeMutableRawPointer(queue), flags, barrier ? 1 : 0, context, work)
  }
  /// `dispatch_async_f` / `dispatch_barrier_async_f` of `work`, run inside a frame for `queue`.
  @inlinable static func asyncInFrame(
    _ queue: OpaquePointer, _ flags: UInt, barrier: Bool, _ context: UnsafeMutableRawPointer?, _ work: Function
  ) {
    cgcd_async_function(UnsafeMutableRawPointer(queue), flags, barrier ? 1 : 0, context, work)
  }
  /// `dispatch_after_f` of `work`, run inside a frame for `queue`.
  @inlinable static func afterInFrame(
    _ when: UInt64, _ queue: OpaquePointer, _ flags: UInt, _ context: UnsafeMutableRawPointer?, _ work: Function
  ) {
    cgcd_after_function(when, UnsafeMutableRawPointer(queue), flags, context, work)
  }
  /// `dispatch_group_notify_f` of `work`, run inside a frame for `queue`.
  @inlinable static func groupNotifyInFrame(
    _ group: OpaquePointer, _ queue: OpaquePointer, _ flags: UInt, _ context: UnsafeMutableRawPointer?,
    _ work: Function
  ) {
    cgcd_group_notify_function(
      UnsafeMutableRawPointer(group), UnsafeMutableRawPointer(queue), flags, context, work)
  }
  /// `dispatch_apply_f` of `work`, each iteration inside a forked frame for `queue`.
  @inlinable static func applyInFrame(
    _ iterations: Int, _ queue: OpaquePointer, _ flags: UInt, _ context: UnsafeMutableRawPointer?,
    _ work: @convention(c) (UnsafeMutableRawPointer?, Int) -> Void
  ) {
    cgcd_apply_function(iterations, UnsafeMutableRawPointer(queue), flags, context, work)
  }
}
