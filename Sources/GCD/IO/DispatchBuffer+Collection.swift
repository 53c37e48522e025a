import Synchronization

// MARK: - Collection

extension DispatchBuffer: RandomAccessCollection {
  /// A byte offset.
  public typealias Index = Int

  /// 0.
  public var startIndex: Int { 0 }

  /// The number of bytes.
  public var endIndex: Int { count }

  /// The byte at `position`, read in place.
  ///
  /// - Parameter position: A byte offset in `0..<count`.
  public subscript(position: Int) -> UInt8 {
    let table = storage.regions
    precondition(
      position >= 0 && !table.regions.isEmpty
        && position < table.regions[table.regions.count - 1].offset + table.regions[table.regions.count - 1].count,
      "GCD: DispatchBuffer[\(position)]: out of bounds")
    let region = table.regions[table.index(of: position)]
    return region.base.load(fromByteOffset: position - region.offset, as: UInt8.self)
  }

  /// Walks the bytes region by region.
  public struct Iterator: IteratorProtocol {
    let table: RegionTable
    var region = 0
    var current: UnsafeRawPointer?
    var end: UnsafeRawPointer?

    init(table: RegionTable) { self.table = table }

    /// The next byte, or nil after the last.
    public mutating func next() -> UInt8? {
      while current == end {
        guard region < table.regions.count else { return nil }
        let next = table.regions[region]
        region += 1
        current = next.base
        end = next.base + next.count
      }
      defer { current! += 1 }
      return current!.load(as: UInt8.self)
    }
  }

  /// An iterator over the bytes, in place.
  public func makeIterator() -> Iterator {
    Iterator(table: storage.regions)
  }

  /// Calls `body` with the bytes when they are in one region; nil otherwise.
  ///
  /// - Parameter body: Receives the bytes, valid only during the call.
  public func withContiguousStorageIfAvailable<Result>(
    _ body: (UnsafeBufferPointer<UInt8>) throws -> Result
  ) rethrows -> Result? {
    let table = storage.regions
    if table.regions.isEmpty { return try body(UnsafeBufferPointer(start: nil, count: 0)) }
    guard table.regions.count == 1 else { return nil }
    let region = table.regions[0]
    return try withExtendedLifetime(storage) {
      try body(UnsafeBufferPointer(start: region.base.assumingMemoryBound(to: UInt8.self), count: region.count))
    }
  }

  /// Copies the bytes into `buffer` region by region (what `Array(buffer)` calls).
  ///
  /// - Parameter buffer: Uninitialized memory for up to `count` bytes.
  public func _copyContents(
    initializing buffer: UnsafeMutableBufferPointer<UInt8>
  ) -> (Iterator, UnsafeMutableBufferPointer<UInt8>.Index) {
    let copied = copyBytes(to: UnsafeMutableRawBufferPointer(buffer))
    var iterator = makeIterator()
    var skipped = 0
    // Position the iterator after the copied bytes, a region at a time.
    while iterator.region < iterator.table.regions.count {
      let next = iterator.table.regions[iterator.region]
      if skipped + next.count > copied {
        iterator.current = next.base + (copied - skipped)
        iterator.end = next.base + next.count
        iterator.region += 1
        break
      }
      skipped += next.count
      iterator.region += 1
    }
    return (iterator, copied)
  }
}

// MARK: - Equatable, description

extension DispatchBuffer: Equatable {
  /// Whether two buffers hold the same bytes, however they are split into regions.
  ///
  /// - Parameters:
  ///   - lhs: A buffer.
  ///   - rhs: Another buffer.
  public static func == (lhs: DispatchBuffer, rhs: DispatchBuffer) -> Bool {
    if lhs.storage.raw == rhs.storage.raw { return true }
    guard lhs.count == rhs.count else { return false }
    let left = lhs.storage.regions.regions
    let right = rhs.storage.regions.regions
    var (i, j, iOffset, jOffset) = (0, 0, 0, 0)
    while i < left.count && j < right.count {
      let length = Swift.min(left[i].count - iOffset, right[j].count - jOffset)
      if !system_memequal(left[i].base + iOffset, right[j].base + jOffset, length) { return false }
      iOffset += length
      jOffset += length
      if iOffset == left[i].count { (i, iOffset) = (i + 1, 0) }
      if jOffset == right[j].count { (j, jOffset) = (j + 1, 0) }
    }
    return withExtendedLifetime((lhs, rhs)) { true }
  }
}

extension DispatchBuffer: CustomStringConvertible {
  /// "DispatchBuffer(12 bytes, 2 regions)".
  public var description: String {
    let regions = regionCount
    return "DispatchBuffer(\(count) bytes, \(regions) region\(regions == 1 ? "" : "s"))"
  }
}
