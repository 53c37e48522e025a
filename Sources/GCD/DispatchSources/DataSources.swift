/// A source you trigger yourself: `merge(_:)` adds to the pending value,
/// and the handler sees the sum of everything merged since its last run.
///
/// Merges from many threads between two handler runs arrive as one event:
/// the values the handler sees add up exactly to what was merged.
///
/// The corresponding C type is a `dispatch_source_t` of type `DISPATCH_SOURCE_TYPE_DATA_ADD`.
public final class DataAddSource: ValueSource, @unchecked Sendable {
  /// Creates the source with handlers on `queue`.
  ///
  /// - Parameter queue: The queue the handlers run on.
  public init(queue: Queue) {
    // A data source with handle 0 and mask 0 is always accepted.
    super.init(created: try! Source.create(.dataAdd, queue: queue), queue: queue)
  }

  /// Adds `value` to the pending data and schedules the handler. Merging 0
  /// does nothing (as in C).
  ///
  /// - Parameter value: The value to merge.
  ///
  /// The corresponding C function is `dispatch_source_merge_data`.
  @inlinable
  public func merge(_ value: UInt) { Libdispatch.source_merge_data(raw, value) }
}

/// A source you trigger yourself: `merge(_:)` ORs bits into the pending
/// value, and the handler sees every bit merged since its last run.
///
/// The corresponding C type is a `dispatch_source_t` of type `DISPATCH_SOURCE_TYPE_DATA_OR`.
public final class DataOrSource: ValueSource, @unchecked Sendable {
  /// Creates the source with handlers on `queue`.
  ///
  /// - Parameter queue: The queue the handlers run on.
  public init(queue: Queue) {
    // A data source with handle 0 and mask 0 is always accepted.
    super.init(created: try! Source.create(.dataOr, queue: queue), queue: queue)
  }

  /// ORs `value` into the pending data and schedules the handler. Merging 0
  /// does nothing (as in C).
  ///
  /// - Parameter value: The value to merge.
  ///
  /// The corresponding C function is `dispatch_source_merge_data`.
  @inlinable
  public func merge(_ value: UInt) { Libdispatch.source_merge_data(raw, value) }
}

/// A source you trigger yourself: `merge(_:)` replaces the pending value,
/// and the handler sees the latest value merged since its last run.
///
/// The corresponding C type is a `dispatch_source_t` of type `DISPATCH_SOURCE_TYPE_DATA_REPLACE`.
public final class DataReplaceSource: ValueSource, @unchecked Sendable {
  /// Creates the source with handlers on `queue`.
  ///
  /// - Parameter queue: The queue the handlers run on.
  public init(queue: Queue) {
    // A data source with handle 0 and mask 0 is always accepted.
    super.init(created: try! Source.create(.dataReplace, queue: queue), queue: queue)
  }

  /// Replaces the pending data with `value` and schedules the handler.
  /// Merging 0 does nothing: libdispatch would store the 0, throwing away a
  /// pending value, and then skip the handler; this returns early instead.
  ///
  /// - Parameter value: The value to merge.
  ///
  /// The corresponding C function is `dispatch_source_merge_data`.
  @inlinable
  public func merge(_ value: UInt) {
    if value == 0 { return }
    Libdispatch.source_merge_data(raw, value)
  }
}
