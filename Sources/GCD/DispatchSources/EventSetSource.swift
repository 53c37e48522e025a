/// A source whose every event carries a set of flags, `Events`: the element `makeEvents()` yields,
/// the value the handler of `setEventHandler(_:)` is called with, and `firedEvents`. Its `data` is
/// the set's raw value. What the set holds is the source's own:
///
/// | source | the events of an event |
/// |---|---|
/// | ``ProcSource`` | the ``ProcEvents`` that fired (`.exit`) |
/// | ``FileSystemSource`` | the ``FileSystemEvents`` that fired since the handler last ran, merged (ORed) |
/// | ``MemoryPressureSource`` | the level the event reports, as ``MemoryPressureEvents`` (the latest, when changes merged) |
///
/// The class holds the members those sources share; only the package makes its subclasses.
///
/// The corresponding C function is `dispatch_source_get_data`.
public class EventSetSource<Events: OptionSet & Sendable>: Source, @unchecked Sendable
where Events.RawValue == UInt {
  // Inlinable: a call on a `ProcSource`, `FileSystemSource` or `MemoryPressureSource` (final) is
  // specialized for its event set, so the handler converts the value as concrete code does.
  /// The source's events as an `AsyncSequence` of the sets that fired (see the table above); it
  /// starts the source (nothing that happens after the call is lost), leaving the loop cancels it
  /// (see `SourceEvents`).
  @inlinable
  public func makeEvents() -> SourceEvents<Events> {
    SourceEvents(source: self, element: { Events(rawValue: $0) })
  }

  /// The source's events, as `makeEvents()` makes them. Deprecated: a property that starts the
  /// source, and cancels it when dropped, reads as if it only looked; Swift names a factory `make…`.
  @available(*, deprecated, renamed: "makeEvents()")
  public var events: SourceEvents<Events> { makeEvents() }

  /// Sets the closure run on the source's queue for each (merged) event, called with the event's
  /// set (`firedEvents`, the table above): the value `makeEvents()` yields. The handler gets it
  /// without capturing the source.
  ///
  /// - Parameter handler: The closure; it runs on the source's queue.
  ///
  /// The corresponding C functions are `dispatch_source_set_event_handler`
  /// and `dispatch_source_get_data`.
  @inlinable
  public func setEventHandler(_ handler: @escaping @Sendable (Events) -> Void) {
    setValueHandler { handler(Events(rawValue: $0)) }
  }

  /// The events of the event being handled (see the table above): `data` as an `Events` set.
  @inlinable
  public var firedEvents: Events { Events(rawValue: data) }
}
