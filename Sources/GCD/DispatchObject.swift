/// What every wrapper in this package shares: it owns exactly one reference
/// to a libdispatch object and releases it in `deinit`, and it exposes the
/// object's context slot and finalizer exactly as C does.
///
/// The context slot belongs to you: the package never stores anything in it.
///
/// Every conforming type is a class whose methods are safe to call from any
/// thread (libdispatch objects are thread-safe), hence `Sendable`.
public protocol DispatchObject: AnyObject, Sendable {
  /// The wrapped C object, borrowed: valid while this wrapper is alive. Use
  /// it to call libdispatch functions this package does not wrap; do not
  /// release it.
  var unsafeObject: OpaquePointer { get }
}

extension DispatchObject {
  /// The application-defined context pointer of the object.
  ///
  /// The corresponding C functions are `dispatch_get_context` and `dispatch_set_context`.
  @inlinable
  public var context: UnsafeMutableRawPointer? {
    get { Libdispatch.get_context(unsafeObject) }
    set { Libdispatch.set_context(unsafeObject, newValue) }
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
  public func setFinalizer(_ finalizer: (@convention(c) (UnsafeMutableRawPointer?) -> Void)?) {
    Libdispatch.set_finalizer_f(unsafeObject, finalizer)
  }
}
