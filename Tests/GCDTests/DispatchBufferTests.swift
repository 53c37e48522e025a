import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// The address of a buffer's first byte when it is one region (nil otherwise).
private func firstAddress(_ buffer: DispatchBuffer) -> UInt? {
  var addresses: [UInt] = []
  buffer.enumerateRegions { bytes, _ in
    addresses.append(UInt(bitPattern: bytes.baseAddress))
    return true
  }
  return addresses.first
}

private func regionAddresses(_ buffer: DispatchBuffer) -> [UInt] {
  var addresses: [UInt] = []
  buffer.enumerateRegions { bytes, _ in
    addresses.append(UInt(bitPattern: bytes.baseAddress))
    return true
  }
  return addresses
}

/// A buffer of `count` bytes 0, 1, 2, ... (mod 256) starting at `start`.
private func counting(_ count: Int, from start: Int = 0) -> DispatchBuffer {
  DispatchBuffer((0..<count).map { UInt8(truncatingIfNeeded: start + $0) })
}

@Suite("DispatchBuffer")
struct DispatchBufferTests {
  @Test("an empty buffer has no bytes and no regions, and equals another empty buffer")
  func empty() {
    let empty = DispatchBuffer()
    #expect(empty.count == 0)
    #expect(empty.isEmpty)
    #expect(empty.regionCount == 0)
    #expect(Array(empty) == [])
    #expect(empty == DispatchBuffer([UInt8]()))
    #expect(empty != DispatchBuffer([1]))
    #expect(empty.description == "DispatchBuffer(0 bytes, 0 regions)")
  }

  @Test("the copying initializer copies: changing the source afterwards does not change the buffer")
  func copying() {
    var source: [UInt8] = [1, 2, 3, 4]
    let buffer = source.withUnsafeBytes { DispatchBuffer(copying: $0) }
    source[0] = 99
    #expect(Array(buffer) == [1, 2, 3, 4])
    #expect(buffer.count == 4)
    let sourceAddress = source.withUnsafeBytes { UInt(bitPattern: $0.baseAddress) }
    #expect(firstAddress(buffer) != sourceAddress)
    #expect(DispatchBuffer("héllo".utf8).count == 6)
  }

  @Test("bytesNoCopy with .free shares the malloc'ed memory and libdispatch frees it")
  func noCopyFree() {
    let memory = malloc(16)!
    memset(memory, 7, 16)
    let buffer = DispatchBuffer(bytesNoCopy: UnsafeRawBufferPointer(start: memory, count: 16), deallocator: .free)
    #expect(firstAddress(buffer) == UInt(bitPattern: memory))
    #expect(Array(buffer) == [UInt8](repeating: 7, count: 16))
  }

  @Test(
    "bytesNoCopy with a custom deallocator: no copy, and the deallocator runs once, on its queue, after the last copy is gone"
  )
  func noCopyCustom() {
    let memory = UnsafeMutableRawBufferPointer.allocate(byteCount: 64, alignment: 1)
    memory.initializeMemory(as: UInt8.self, repeating: 5)
    let calls = Counter()
    let released = Event()
    let queue = Queue(label: "deallocator")
    let key = Queue.SpecificKey<String>()
    queue.setSpecific(key, "deallocator")
    let onQueue = Mutex(false)
    let address = UInt(bitPattern: memory.baseAddress)
    do {
      let buffer = DispatchBuffer(
        bytesNoCopy: UnsafeRawBufferPointer(memory),
        deallocator: .custom(queue: queue) { bytes in
          onQueue.withLock { $0 = Queue.currentSpecific(key) == "deallocator" }
          #expect(UInt(bitPattern: bytes.baseAddress) == address && bytes.count == 64)
          calls.increment()
          UnsafeMutableRawBufferPointer(mutating: bytes).deallocate()
          released.signal()
        })
      #expect(firstAddress(buffer) == address)
      let copy = buffer
      let joined = buffer + DispatchBuffer([1])
      _ = (copy, joined)
      #expect(!released.isSignaled)
    }
    #expect(released.wait())
    #expect(!pollBriefly { calls.current > 1 })
    #expect(calls.current == 1)
    #expect(onQueue.withLock { $0 })
  }

  @Test("concatenation shares both buffers' bytes: its regions are theirs, in order")
  func concatenation() {
    let first = counting(100)
    let second = counting(50, from: 100)
    let joined = first + second
    #expect(joined.count == 150)
    #expect(joined.regionCount == 2)
    #expect(regionAddresses(joined) == [firstAddress(first)!, firstAddress(second)!])
    #expect(Array(joined) == (0..<150).map { UInt8($0) })
    var appended = first
    appended.append(second)
    #expect(appended == joined)
    #expect(first.count == 100)
  }

  @Test(
    "append grows a buffer only it holds in place, and leaves copies and iterators made before it with their bytes"
  )
  func appendInPlace() {
    var grown = DispatchBuffer()
    for part in 0..<100 { grown.append(counting(3, from: part * 3)) }
    #expect(grown.count == 300 && grown.regionCount == 100)
    #expect(Array(grown) == (0..<300).map { UInt8(truncatingIfNeeded: $0) })
    var buffer = counting(4) + counting(4, from: 4)
    let copy = buffer
    var iterator = buffer.makeIterator()
    buffer.append(counting(4, from: 8))
    #expect(Array(buffer) == (0..<12).map { UInt8($0) })
    #expect(Array(copy) == (0..<8).map { UInt8($0) })
    var iterated: [UInt8] = []
    while let byte = iterator.next() { iterated.append(byte) }
    #expect(iterated == (0..<8).map { UInt8($0) })
    buffer.append(buffer)
    #expect(Array(buffer) == (0..<12).map { UInt8($0) } + (0..<12).map { UInt8($0) })
  }

  @Test("an iterator keeps the bytes alive after the buffer it came from is gone")
  func iteratorOutlivesBuffer() {
    var iterator = { counting(64) + counting(64, from: 64) }().makeIterator()
    // Reuse the freed memory, if it were freed.
    let reuse = (0..<64).map { _ in [UInt8](repeating: 0xEE, count: 64) }
    var iterated: [UInt8] = []
    while let byte = iterator.next() { iterated.append(byte) }
    #expect(iterated == (0..<128).map { UInt8($0) })
    #expect(reuse.count == 64)
  }

  @Test("extracting shares the bytes and starts its indices at 0")
  func extracting() {
    let joined = counting(100) + counting(100, from: 100)
    let middle = joined.extracting(90..<120)
    #expect(middle.count == 30)
    #expect(middle.startIndex == 0)
    #expect(Array(middle) == (90..<120).map { UInt8($0) })
    #expect(middle.regionCount == 2)
    let inner = joined.extracting(10..<20)
    #expect(firstAddress(inner) == firstAddress(joined)! + 10)
    #expect(joined.extracting(0..<200) == joined)
    #expect(joined.extracting(50..<50).isEmpty)
    #expect(Array(joined[95..<105]) == (95..<105).map { UInt8($0) })
  }

  @Test("extracting out of bounds stops the program with a message")
  func extractingOutOfBounds() async {
    await #expect(processExitsWith: .failure) {
      _ = counting(10).extracting(5..<11)
    }
  }

  @Test("enumerateRegions visits every region with its offset, stops when asked, and rethrows")
  func regions() throws {
    let buffer = counting(10) + counting(20, from: 10) + counting(30, from: 30)
    var seen: [(Int, Int)] = []
    let finished = buffer.enumerateRegions { bytes, offset in
      seen.append((offset, bytes.count))
      #expect(bytes.first == UInt8(offset))
      return true
    }
    #expect(finished)
    #expect(seen.map(\.0) == [0, 10, 30])
    #expect(seen.map(\.1) == [10, 20, 30])
    var visits = 0
    #expect(
      !buffer.enumerateRegions { _, _ in
        visits += 1
        return false
      })
    #expect(visits == 1)
    struct Stop: Error {}
    #expect(throws: Stop.self) {
      try buffer.enumerateRegions { _, offset in
        if offset == 10 { throw Stop() }
        return true
      }
    }
  }

  @Test("copyBytes copies any range across regions into the destination, as many as fit")
  func copyBytes() {
    let buffer = counting(10) + counting(20, from: 10) + counting(30, from: 30)
    var destination = [UInt8](repeating: 0, count: 60)
    #expect(destination.withUnsafeMutableBytes { buffer.copyBytes(to: $0) } == 60)
    #expect(destination == (0..<60).map { UInt8($0) })
    var part = [UInt8](repeating: 0, count: 25)
    #expect(part.withUnsafeMutableBytes { buffer.copyBytes(to: $0, from: 5..<45) } == 25)
    #expect(part == (5..<30).map { UInt8($0) })
    var wide = [UInt8](repeating: 0xFF, count: 8)
    #expect(wide.withUnsafeMutableBytes { buffer.copyBytes(to: $0, from: 28..<32) } == 4)
    #expect(wide == [28, 29, 30, 31, 0xFF, 0xFF, 0xFF, 0xFF])
    #expect(wide.withUnsafeMutableBytes { buffer.copyBytes(to: $0, from: 7..<7) } == 0)
  }

  @Test("a contiguous view of one region is the same memory; of several, one region that outlives the buffer")
  func contiguous() {
    let single = counting(64)
    let view = single.contiguous()
    view.withUnsafeBytes { #expect(UInt(bitPattern: $0.baseAddress) == firstAddress(single)) }
    var joinedView: DispatchBuffer.ContiguousView?
    do {
      let joined = counting(10) + counting(10, from: 10)
      joinedView = joined.contiguous()
      #expect(joined.regionCount == 2)
    }
    #expect(joinedView!.buffer.regionCount == 1)
    joinedView!.withUnsafeBytes { #expect(Array($0) == (0..<20).map { UInt8($0) }) }
    let sum = (counting(3) + counting(3, from: 3)).withUnsafeBytes { $0.reduce(0) { $0 + Int($1) } }
    #expect(sum == 15)
  }

  @Test("as a Collection: subscript across regions, iteration, reversed, Array, contiguous storage only for one region")
  func collection() {
    let buffer = counting(3) + counting(4, from: 3) + counting(5, from: 7)
    #expect(buffer.indices == 0..<12)
    #expect((0..<12).map { buffer[$0] } == (0..<12).map { UInt8($0) })
    var iterated: [UInt8] = []
    for byte in buffer { iterated.append(byte) }
    #expect(iterated == (0..<12).map { UInt8($0) })
    #expect(Array(buffer.reversed()) == (0..<12).reversed().map { UInt8($0) })
    #expect(buffer.withContiguousStorageIfAvailable { $0.count } == nil)
    #expect(counting(5).withContiguousStorageIfAvailable { Array($0) } == [0, 1, 2, 3, 4])
    #expect(buffer.firstIndex(of: 9) == 9)
    #expect(buffer.description == "DispatchBuffer(12 bytes, 3 regions)")
  }

  @Test("Equatable compares bytes, not how they are split into regions")
  func equality() {
    let whole = counting(300)
    let split = counting(100) + counting(150, from: 100) + counting(50, from: 250)
    let other = counting(7) + counting(293, from: 7)
    #expect(whole == split)
    #expect(split == other)
    #expect(whole != counting(299))
    var changed = (0..<300).map { UInt8(truncatingIfNeeded: $0) }
    changed[299] ^= 1
    #expect(whole != DispatchBuffer(changed))
  }

  @Test("buffers cross tasks (Sendable) and concurrent first uses of the region table agree")
  func sendable() async {
    let buffer = counting(1000) + counting(1000, from: 1000)
    let sums = await withTaskGroup(of: Int.self) { group in
      for _ in 0..<8 { group.addTask { buffer.reduce(0) { $0 + Int($1) } } }
      var sums: [Int] = []
      for await sum in group { sums.append(sum) }
      return sums
    }
    let expected = (0..<2000).reduce(0) { $0 + Int(UInt8(truncatingIfNeeded: $1)) }
    #expect(sums == [Int](repeating: expected, count: 8))
  }
}
