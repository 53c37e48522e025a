import Synchronization

/// An immutable, possibly discontiguous run of bytes over libdispatch's
/// `dispatch_data_t`: what an ``IOChannel`` reads and writes.
///
/// Concatenation and sub-ranges share the bytes instead of copying them;
/// a buffer may therefore consist of several contiguous regions, which
/// ``enumerateRegions(_:)`` visits in order. As a `Collection` of `UInt8`
/// it is indexed from 0 to `count` without copying: elements are read from
/// the regions in place, and `Array(buffer)` copies region by region.
///
/// Named `DispatchBuffer` so that it clashes neither with Foundation's
/// `Data` nor with the toolchain overlay's `DispatchData` (nor SwiftNIO's
/// `ByteBuffer`), any of which a program may import beside this package.
///
/// A value type: copies share one C object, which is released when the
/// last copy goes away. `Sendable`: dispatch data objects are immutable.
///
/// The corresponding C type is `dispatch_data_t`.
public struct DispatchBuffer: Sendable {
  @usableFromInline var storage: Storage

  /// The one reference to the C object a set of buffer copies shares.
  ///
  /// `@unchecked Sendable`: the C object is immutable and thread-safe; the
  /// region table is computed at most once per winner and published through an atomic.
  @usableFromInline
  final class Storage: @unchecked Sendable {
    /// Replaced only by `adopt`, while one buffer alone holds this box.
    @exclusivity(unchecked) @usableFromInline var raw: OpaquePointer
    let table = Atomic<Unmanaged<RegionTable>?>(nil)

    @inlinable init(adopting raw: OpaquePointer) { self.raw = raw }

    deinit {
      table.load(ordering: .acquiring)?.release()
      Libdispatch.release(raw)
    }

    /// Gives the box a new C object (a +1 reference) in place of its own:
    /// for a buffer that is the only holder of the box, so that `append`
    /// allocates no new box. A region table made for the old object keeps
    /// that object alive for whoever still reads it.
    @usableFromInline func adopt(_ new: OpaquePointer) {
      table.exchange(nil, ordering: .acquiringAndReleasing)?.release()
      Libdispatch.release(raw)
      raw = new
    }

    /// The regions with their offsets, computed on first use.
    var regions: RegionTable {
      if let table = table.load(ordering: .acquiring) { return table.takeUnretainedValue() }
      let made = Unmanaged.passRetained(RegionTable(raw))
      let (exchanged, current) = table.compareExchange(
        expected: nil, desired: made, successOrdering: .acquiringAndReleasing, failureOrdering: .acquiring)
      if exchanged { return made.takeUnretainedValue() }
      made.release()
      return current!.takeUnretainedValue()
    }
  }

  /// The contiguous regions of one C object, in order; the table holds a
  /// reference to the object, so the regions stay valid as long as the table
  /// (an iterator holds only the table).
  final class RegionTable: @unchecked Sendable {  // the C object is immutable and thread-safe
    struct Region {
      var offset: Int
      // `Int` bit pattern of the region's first byte (a pointer is not Sendable).
      var address: UInt
      var count: Int
      var base: UnsafeRawPointer { UnsafeRawPointer(bitPattern: address)! }
    }
    let regions: [Region]
    let object: OpaquePointer

    deinit { Libdispatch.release(object) }

    init(_ raw: OpaquePointer) {
      Libdispatch.retain(raw)
      object = raw
      var regions: [Region] = []
      withUnsafeMutablePointer(to: &regions) { list in
        _ = Libdispatch.data_apply_f(raw, list) { context, _, offset, buffer, size in
          context!.assumingMemoryBound(to: [Region].self).pointee.append(
            Region(offset: offset, address: UInt(bitPattern: buffer), count: size))
          return true
        }
      }
      self.regions = regions
    }

    /// The index of the region that holds byte `position` (which must be in range).
    func index(of position: Int) -> Int {
      var low = 0
      var high = regions.count - 1
      while low < high {
        let middle = (low + high + 1) / 2
        if regions[middle].offset <= position { low = middle } else { high = middle - 1 }
      }
      return low
    }
  }

  /// Adopts a C object the caller owns a reference to (a +1 result).
  @inlinable init(adopting raw: OpaquePointer) { storage = Storage(adopting: raw) }

  /// Wraps a C object borrowed from libdispatch (a handler argument), retaining it.
  init(borrowing raw: OpaquePointer) {
    Libdispatch.retain(raw)
    storage = Storage(adopting: raw)
  }

  /// The C object, borrowed: valid while this buffer (or a copy) is alive.
  /// Use it to call libdispatch functions this package does not wrap; do not release it.
  public var unsafeObject: OpaquePointer { storage.raw }

  // MARK: Creating

  /// Creates an empty buffer.
  ///
  /// The corresponding C constant is `dispatch_data_empty`.
  public init() { self.init(adopting: Libdispatch.data_empty) }

  /// Creates a buffer holding a copy of `bytes`.
  ///
  /// - Parameter bytes: The bytes to copy; the buffer does not refer to them afterwards.
  ///
  /// The corresponding C function is `dispatch_data_create` with `DISPATCH_DATA_DESTRUCTOR_DEFAULT`.
  public init(copying bytes: UnsafeRawBufferPointer) {
    guard let base = bytes.baseAddress, bytes.count > 0 else {
      self.init()
      return
    }
    self.init(adopting: Libdispatch.data_create(base, bytes.count, nil, destructor: nil))
  }

  /// Creates a buffer holding a copy of `bytes`.
  ///
  /// - Parameter bytes: The bytes to copy, an array or any sequence of `UInt8`.
  ///
  /// The corresponding C function is `dispatch_data_create` with `DISPATCH_DATA_DESTRUCTOR_DEFAULT`.
  public init(_ bytes: some Sequence<UInt8>) {
    if let buffer = bytes as? DispatchBuffer {
      self = buffer
      return
    }
    let made = bytes.withContiguousStorageIfAvailable { DispatchBuffer(copying: UnsafeRawBufferPointer($0)) }
    self = made ?? Array(bytes).withUnsafeBytes { DispatchBuffer(copying: $0) }
  }

  /// What releases the memory of a buffer created without copying.
  public enum Deallocator: Sendable {
    /// `free(3)` (the memory came from `malloc`).
    ///
    /// The corresponding C constant is `DISPATCH_DATA_DESTRUCTOR_FREE`.
    case free
    /// `munmap(2)` (the memory came from `mmap`).
    ///
    /// The corresponding C constant is `DISPATCH_DATA_DESTRUCTOR_MUNMAP`.
    case unmap
    /// A closure called once with the memory, on `queue` (a global queue when nil),
    /// after the last buffer that refers to it is gone.
    case custom(queue: Queue?, @Sendable (UnsafeRawBufferPointer) -> Void)
  }

  /// Creates a buffer over `bytes` without copying them; `deallocator`
  /// releases them once no buffer refers to them any more.
  ///
  /// The memory must stay valid and unchanged until then. An empty `bytes`
  /// gives the empty buffer and calls the deallocator at once.
  ///
  /// - Parameters:
  ///   - bytes: The memory the buffer takes over.
  ///   - deallocator: What releases the memory.
  ///
  /// The corresponding C function is `dispatch_data_create`.
  public init(bytesNoCopy bytes: UnsafeRawBufferPointer, deallocator: Deallocator) {
    guard let base = bytes.baseAddress else {
      if case .custom(_, let release) = deallocator { release(bytes) }
      self.init()
      return
    }
    switch deallocator {
    case .free:
      self.init(adopting: Libdispatch.data_create(base, bytes.count, nil, destructor: Libdispatch.data_destructor_free))
    case .unmap:
      self.init(
        adopting: Libdispatch.data_create(base, bytes.count, nil, destructor: Libdispatch.data_destructor_munmap))
    case .custom(let queue, let release):
      self.init(adopting: Libdispatch.data_create(base, bytes.count, queue?.raw, block: { release(bytes) }))
    }
  }

  // MARK: Size and composition

  /// The number of bytes.
  ///
  /// The corresponding C function is `dispatch_data_get_size`.
  @inlinable public var count: Int { Libdispatch.data_get_size(storage.raw) }

  /// This buffer followed by `other`, sharing the bytes of both.
  ///
  /// - Parameter other: The bytes to put after this buffer's.
  /// - Returns: A buffer of `count + other.count` bytes; nothing is copied.
  ///
  /// The corresponding C function is `dispatch_data_create_concat`.
  @inlinable public func appending(_ other: DispatchBuffer) -> DispatchBuffer {
    DispatchBuffer(adopting: Libdispatch.data_create_concat(storage.raw, other.storage.raw))
  }

  /// Appends `other` to this buffer, sharing its bytes.
  ///
  /// - Parameter other: The bytes to put after this buffer's.
  ///
  /// The corresponding C function is `dispatch_data_create_concat`.
  @inlinable public mutating func append(_ other: DispatchBuffer) {
    let joined = Libdispatch.data_create_concat(storage.raw, other.storage.raw)
    if isKnownUniquelyReferenced(&storage) {
      storage.adopt(joined)
    } else {
      storage = Storage(adopting: joined)
    }
  }

  /// The concatenation of two buffers, sharing the bytes of both.
  ///
  /// - Parameters:
  ///   - lhs: The first bytes.
  ///   - rhs: The bytes that follow.
  ///
  /// The corresponding C function is `dispatch_data_create_concat`.
  @inlinable public static func + (lhs: DispatchBuffer, rhs: DispatchBuffer) -> DispatchBuffer {
    lhs.appending(rhs)
  }

  /// The bytes in `bounds` as a buffer of their own, sharing them.
  ///
  /// Its indices start at 0 (unlike `self[bounds]`, a `Slice` that keeps this
  /// buffer's indices). A range outside `0..<count` stops the program, as an
  /// array's subscript does.
  ///
  /// - Parameter bounds: Byte offsets within `0...count`.
  ///
  /// The corresponding C function is `dispatch_data_create_subrange`.
  public func extracting(_ bounds: Range<Int>) -> DispatchBuffer {
    let total = count
    precondition(
      bounds.lowerBound >= 0 && bounds.upperBound <= total,
      "GCD: DispatchBuffer.extracting(\(bounds)): out of bounds for \(total) bytes")
    if bounds.count == total { return self }
    return DispatchBuffer(adopting: Libdispatch.data_create_subrange(storage.raw, bounds.lowerBound, bounds.count))
  }

  // MARK: Reading the bytes

  /// The number of contiguous regions the bytes are kept in (0 when empty).
  public var regionCount: Int { storage.regions.regions.count }

  /// Calls `body` with each contiguous region in order, and the region's
  /// offset in the buffer, until it returns false.
  ///
  /// The bytes are valid only during the call. Nothing is copied or allocated.
  ///
  /// - Parameter body: Receives the region's bytes and its offset; returns
  ///   false to stop.
  /// - Returns: false if `body` stopped the walk.
  ///
  /// The corresponding C function is `dispatch_data_apply`.
  @discardableResult
  public func enumerateRegions<Failure: Error>(
    _ body: (_ bytes: UnsafeRawBufferPointer, _ offset: Int) throws(Failure) -> Bool
  ) throws(Failure) -> Bool {
    var failure: Failure?
    let finished = applyRegions { bytes, offset in
      do throws(Failure) {
        return try body(bytes, offset)
      } catch {
        failure = error
        return false
      }
    }
    if let failure { throw failure }
    return finished
  }

  /// `dispatch_data_apply_f` of a non-escaping closure, through a context on the stack.
  private func applyRegions(_ body: (UnsafeRawBufferPointer, Int) -> Bool) -> Bool {
    withoutActuallyEscaping(body) { body in
      var walk = RegionWalk(body: body)
      return withUnsafeMutablePointer(to: &walk) { walk in
        Libdispatch.data_apply_f(storage.raw, walk) { context, _, offset, buffer, size in
          context!.assumingMemoryBound(to: RegionWalk.self).pointee.body(
            UnsafeRawBufferPointer(start: buffer, count: size), offset)
        }
      }
    }
  }

  /// Copies the bytes in `range` (all of them when nil) into `destination`,
  /// region by region with no intermediate buffer, as many as fit.
  ///
  /// - Parameters:
  ///   - destination: Where the bytes go.
  ///   - range: The byte offsets to copy; nil for the whole buffer.
  /// - Returns: The number of bytes copied: the smaller of the range's and
  ///   the destination's size.
  ///
  /// The corresponding C function is `dispatch_data_apply`.
  @discardableResult
  public func copyBytes(to destination: UnsafeMutableRawBufferPointer, from range: Range<Int>? = nil) -> Int {
    let total = count
    let range = range ?? 0..<total
    precondition(
      range.lowerBound >= 0 && range.upperBound <= total,
      "GCD: DispatchBuffer.copyBytes(from: \(range)): out of bounds for \(total) bytes")
    guard let target = destination.baseAddress else { return 0 }
    let end = range.lowerBound + Swift.min(range.count, destination.count)
    guard end > range.lowerBound else { return 0 }
    Libdispatch.data_copy_out(storage.raw, target, range.lowerBound, end, total: total)
    return end - range.lowerBound
  }

  /// Calls `body` with all the bytes in one contiguous piece of memory.
  ///
  /// A buffer of one region is passed as it is; a discontiguous one is
  /// first copied into one region (see ``contiguous()`` to keep that copy).
  ///
  /// - Parameter body: Receives the bytes, valid only during the call.
  /// - Returns: What `body` returns.
  ///
  /// The corresponding C function is `dispatch_data_create_map`.
  public func withUnsafeBytes<Result>(_ body: (UnsafeRawBufferPointer) throws -> Result) rethrows -> Result {
    try contiguous().withUnsafeBytes(body)
  }

  /// The bytes in one contiguous piece of memory that lives as long as the returned view.
  ///
  /// A buffer of one region is mapped without copying.
  ///
  /// The corresponding C function is `dispatch_data_create_map`.
  public func contiguous() -> ContiguousView {
    var base: UnsafeRawPointer?
    var size = 0
    let mapped = Libdispatch.data_create_map(storage.raw, &base, &size)
    return ContiguousView(buffer: DispatchBuffer(adopting: mapped), address: UInt(bitPattern: base), count: size)
  }

  /// The bytes of a buffer in one contiguous piece of memory, kept alive by the view.
  public struct ContiguousView: Sendable {
    /// The contiguous buffer (one region) that holds the bytes.
    public let buffer: DispatchBuffer
    let address: UInt
    let count: Int

    /// Calls `body` with the bytes, which stay valid as long as this view.
    ///
    /// - Parameter body: Receives the bytes.
    /// - Returns: What `body` returns.
    public func withUnsafeBytes<Result>(_ body: (UnsafeRawBufferPointer) throws -> Result) rethrows -> Result {
      try withExtendedLifetime(buffer) {
        try body(UnsafeRawBufferPointer(start: UnsafeRawPointer(bitPattern: address), count: count))
      }
    }
  }
}

/// The context of `enumerateRegions`'s C callback.
private struct RegionWalk {
  var body: (UnsafeRawBufferPointer, Int) -> Bool
}
