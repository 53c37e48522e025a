/// A source whose every event carries one `UInt`, its `data`: the element `makeEvents()` yields
/// and the value the handler of `setEventHandler(_:)` is called with. Events that come while the
/// handler runs, or while the source is suspended, merge into one; what the value then says is
/// the source's own:
///
/// | source | the value of an event |
/// |---|---|
/// | ``DataAddSource`` | the sum of the values merged since the last event |
/// | ``DataOrSource`` | the bits merged since the last event |
/// | ``DataReplaceSource`` | the latest value merged |
/// | ``TimerSource`` | the fires the event stands for (`fireCount`) |
/// | ``SignalSource`` | the deliveries merged into the event (`count`) |
/// | ``PressureSource`` | the fires (the trigger's events) merged into the event |
/// | ``ReadSource`` | an estimate of the bytes available (`bytesAvailable`); read them with `read(into:)` |
/// | ``WriteSource`` | the bytes still queued for sending on a socket (`SIOCOUTQ`), 1 where the kernel does not say: not the room left |
///
/// The class holds the members those sources share; only the package makes its subclasses.
///
/// The corresponding C function is `dispatch_source_get_data`.
public class ValueSource: Source, @unchecked Sendable {
  /// The source's events as an `AsyncSequence` of their values; it starts the source (nothing that
  /// happens after the call is lost; a ``SignalSource``'s returns once the kernel watches the
  /// signal), leaving the loop cancels it (see `SourceEvents`).
  public func makeEvents() -> SourceEvents<UInt> { SourceEvents(source: self, element: { $0 }) }

  /// The source's events, as `makeEvents()` makes them. Deprecated: a property that starts the
  /// source, and cancels it when dropped, reads as if it only looked; Swift names a factory `make…`.
  @available(*, deprecated, renamed: "makeEvents()")
  public var events: SourceEvents<UInt> { makeEvents() }

  /// Sets the closure run on the source's queue for each (merged) event, called with the event's
  /// value (`data`, the table above): the value `makeEvents()` yields. The handler gets it without
  /// capturing the source.
  ///
  /// - Parameter handler: The closure; it runs on the source's queue.
  ///
  /// The corresponding C functions are `dispatch_source_set_event_handler`
  /// and `dispatch_source_get_data`.
  public func setEventHandler(_ handler: @escaping @Sendable (UInt) -> Void) {
    setValueHandler(handler)
  }
}
