import CDispatch
import CGCD

/// What every wrapper in this package shares: it owns exactly one reference
/// to a libdispatch object and releases it in `deinit`, and it exposes the
/// object's context slot and finalizer exactly as C does.
///
/// The context slot belongs to you: the package never stores anything in it.
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
    get { dispatch_get_context(dispatch_object_t(_do: unsafeObject)) }
    set { dispatch_set_context(dispatch_object_t(_do: unsafeObject), newValue) }
  }

  /// Sets the function libdispatch calls with the context pointer after the
  /// last reference to the object is gone (typically to free the context).
  ///
  /// libdispatch calls the finalizer only when the context is non-nil at
  /// that point; with a nil context nothing is called. It runs on the
  /// object's target queue (for queues and sources) and exactly once.
  ///
  /// The corresponding C function is `dispatch_set_finalizer_f`.
  @inlinable
  public func setFinalizer(_ finalizer: (@convention(c) (UnsafeMutableRawPointer?) -> Void)?) {
    dispatch_set_finalizer_f(dispatch_object_t(_do: unsafeObject), finalizer)
  }
}

extension OpaquePointer {
  /// The object as libdispatch's transparent-union argument type.
  @inlinable
  var object: dispatch_object_t { dispatch_object_t(_do: self) }

  @inlinable
  var raw: UnsafeMutableRawPointer { UnsafeMutableRawPointer(self) }
}
