import CDispatch
import CGCD

/// A source you trigger yourself: `merge(_:)` adds to the pending value,
/// and the handler sees the sum of everything merged since its last run.
///
/// Merges from many threads between two handler runs arrive as one event:
/// the values the handler sees add up exactly to what was merged.
///
/// The corresponding C type is a `dispatch_source_t` of type `DISPATCH_SOURCE_TYPE_DATA_ADD`.
public final class DataAddSource: SourceCore, Source, @unchecked Sendable {
  /// Creates the source with handlers on `queue`.
  public init(queue: Queue) {
    super.init(
      created: try! SourceCore.create(type: cgcd_source_type_data_add(), handle: 0, mask: 0, queue: queue), queue: queue
    )
  }

  /// Adds `value` to the pending data and schedules the handler. Merging 0
  /// does nothing (as in C).
  ///
  /// The corresponding C function is `dispatch_source_merge_data`.
  @inlinable
  public func merge(_ value: UInt) { dispatch_source_merge_data(raw, value) }
}

/// A source you trigger yourself: `merge(_:)` ORs bits into the pending
/// value, and the handler sees every bit merged since its last run.
///
/// The corresponding C type is a `dispatch_source_t` of type `DISPATCH_SOURCE_TYPE_DATA_OR`.
public final class DataOrSource: SourceCore, Source, @unchecked Sendable {
  /// Creates the source with handlers on `queue`.
  public init(queue: Queue) {
    super.init(
      created: try! SourceCore.create(type: cgcd_source_type_data_or(), handle: 0, mask: 0, queue: queue), queue: queue)
  }

  /// ORs `value` into the pending data and schedules the handler. Merging 0
  /// does nothing (as in C).
  ///
  /// The corresponding C function is `dispatch_source_merge_data`.
  @inlinable
  public func merge(_ value: UInt) { dispatch_source_merge_data(raw, value) }
}

/// A source you trigger yourself: `merge(_:)` replaces the pending value,
/// and the handler sees the latest value merged since its last run.
///
/// The corresponding C type is a `dispatch_source_t` of type `DISPATCH_SOURCE_TYPE_DATA_REPLACE`.
public final class DataReplaceSource: SourceCore, Source, @unchecked Sendable {
  /// Creates the source with handlers on `queue`.
  public init(queue: Queue) {
    super.init(
      created: try! SourceCore.create(type: cgcd_source_type_data_replace(), handle: 0, mask: 0, queue: queue),
      queue: queue)
  }

  /// Replaces the pending data with `value` and schedules the handler.
  /// Merging 0 does nothing: libdispatch would store the 0, throwing away a
  /// pending value, and then skip the handler; this returns early instead.
  ///
  /// The corresponding C function is `dispatch_source_merge_data`.
  @inlinable
  public func merge(_ value: UInt) {
    if value == 0 { return }
    dispatch_source_merge_data(raw, value)
  }
}
