/// What every wrapper of a libdispatch object in this package shares — `Queue`, `Group`,
/// `Semaphore` and every `Source`: it owns exactly one reference to its C object and releases it
/// in `deinit`, and it exposes the object's context slot and finalizer exactly as C does.
///
/// The context slot belongs to you: the package never stores anything in it.
///
/// A class, public but not open: only this package's wrappers are `GCDObject`s, so `context` and
/// `setFinalizer` always act on a live libdispatch object (a protocol, as `DispatchObject` was,
/// let any type adopt it with any pointer). The name cannot clash with Dispatch's
/// `DispatchObject`, which a file that imports Foundation sees too.
///
/// `Sendable`: libdispatch objects are thread-safe, and every subclass's own state is
/// immutable, atomic or behind a mutex.
public class GCDObject: @unchecked Sendable {
  /// The wrapped C object, owned (one reference, released by the subclass's `deinit`).
  @usableFromInline final let raw: OpaquePointer

  @inlinable
  init(raw: OpaquePointer) { self.raw = raw }

  /// The wrapped C object, borrowed: valid while this wrapper is alive. Use
  /// it to call libdispatch functions this package does not wrap; do not
  /// release it, and do not cancel a source through it (`Source.cancel()`
  /// runs the package's own cleanup, such as a descriptor's leaving the
  /// package's epoll set, which `dispatch_source_cancel` alone skips).
  @inlinable
  public final var unsafeObject: OpaquePointer { raw }

  /// The application-defined context pointer of the object.
  ///
  /// The corresponding C functions are `dispatch_get_context` and `dispatch_set_context`.
  @inlinable
  public final var context: UnsafeMutableRawPointer? {
    get { Libdispatch.get_context(raw) }
    set { Libdispatch.set_context(raw, newValue) }
  }

  /// Sets the function libdispatch calls with the context pointer after the
  /// last reference to the object is gone (typically to free the context).
  ///
  /// libdispatch calls the finalizer only when the context is non-nil at
  /// that point; with a nil context nothing is called. It runs on the
  /// object's target queue (for queues and sources) and exactly once.
  ///
  /// - Parameter finalizer: The function to call with the context, or nil for none.
  ///
  /// The corresponding C function is `dispatch_set_finalizer_f`.
  @inlinable
  public final func setFinalizer(_ finalizer: (@convention(c) (UnsafeMutableRawPointer?) -> Void)?) {
    Libdispatch.set_finalizer_f(raw, finalizer)
  }
}

/// The name `GCDObject` had before 1.0, when it was a protocol. With Foundation imported it is
/// ambiguous with Dispatch's `DispatchObject`; use `GCDObject`.
@available(*, deprecated, renamed: "GCDObject")
public typealias DispatchObject = GCDObject
