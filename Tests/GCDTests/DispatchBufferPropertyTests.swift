import GCD
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

private struct Modelled {
  var buffer: DispatchBuffer
  var model: [UInt8]
}

/// Random sequences of the buffer's operations, each checked against a `[UInt8]` model. The pool's
/// buffers share regions with one another (concatenations and subranges of each other), which is
/// where a wrong offset or a region table built for the wrong buffer would show.
private struct BufferMachine {
  var random: SeededRandom
  var pool: [Modelled] = Array(repeating: Modelled(buffer: DispatchBuffer(), model: []), count: 8)
  /// A buffer that grows past this is cut down to a subrange, so each check stays cheap.
  let largest = 1 << 14

  init(seed: UInt64) { random = SeededRandom(seed: seed) }

  mutating func index() -> Int { Int.random(in: 0..<pool.count, using: &random) }

  /// A size: mostly small, sometimes a few KiB.
  mutating func size() -> Int {
    Int.random(in: 0..<8, using: &random) == 0
      ? Int.random(in: 0...2048, using: &random) : Int.random(in: 0...48, using: &random)
  }

  mutating func range(in count: Int) -> Range<Int> {
    let lower = Int.random(in: 0...count, using: &random)
    return lower..<Int.random(in: lower...count, using: &random)
  }

  mutating func bytes(_ count: Int) -> [UInt8] { (0..<count).map { _ in UInt8.random(in: 0...255, using: &random) } }

  /// A new buffer made one of the ways there are.
  mutating func make() -> Modelled {
    let model = bytes(size())
    switch Int.random(in: 0..<5, using: &random) {
    case 0: return Modelled(buffer: DispatchBuffer(model), model: model)
    case 1: return Modelled(buffer: model.withUnsafeBytes { DispatchBuffer(copying: $0) }, model: model)
    case 2 where !model.isEmpty:
      let memory = malloc(model.count)!
      memory.copyMemory(from: model, byteCount: model.count)
      let bytes = UnsafeRawBufferPointer(start: memory, count: model.count)
      return Modelled(buffer: DispatchBuffer(bytesNoCopy: bytes, deallocator: .free), model: model)
    case 3 where !model.isEmpty:
      let memory = UnsafeMutableRawPointer.allocate(byteCount: model.count, alignment: 1)
      memory.copyMemory(from: model, byteCount: model.count)
      let bytes = UnsafeRawBufferPointer(start: memory, count: model.count)
      let release: @Sendable (UnsafeRawBufferPointer) -> Void = {
        UnsafeMutableRawPointer(mutating: $0.baseAddress!).deallocate()
      }
      return Modelled(
        buffer: DispatchBuffer(bytesNoCopy: bytes, deallocator: .custom(queue: nil, release)), model: model)
    default: return Modelled(buffer: DispatchBuffer(), model: [])
    }
  }

  /// One random operation; a description of what went wrong, or nil.
  mutating func step() -> String? {
    let (i, j, k) = (index(), index(), index())
    switch Int.random(in: 0..<10, using: &random) {
    case 0:
      pool[k] = make()
    case 1:
      pool[i].buffer.append(pool[j].buffer)
      pool[i].model += pool[j].model
    case 2:
      pool[k] = Modelled(buffer: pool[i].buffer.appending(pool[j].buffer), model: pool[i].model + pool[j].model)
    case 3:
      pool[k] = Modelled(buffer: pool[i].buffer + pool[j].buffer, model: pool[i].model + pool[j].model)
    case 4, 5:
      let bounds = range(in: pool[i].model.count)
      pool[k] = Modelled(buffer: pool[i].buffer.extracting(bounds), model: Array(pool[i].model[bounds]))
    case 6:
      if let failure = checkCopyBytes(pool[i]) { return "copyBytes: \(failure)" }
    case 7:
      if let failure = checkIteration(pool[i]) { return "iteration: \(failure)" }
    case 8:
      if let failure = checkRegions(pool[i]) { return "regions: \(failure)" }
    default:
      if (pool[i].buffer == pool[j].buffer) != (pool[i].model == pool[j].model) {
        return "== says \(pool[i].buffer == pool[j].buffer) for \(pool[i].buffer) and \(pool[j].buffer)"
      }
    }
    for slot in [i, k] where pool[slot].model.count > largest {
      let bounds = range(in: pool[slot].model.count).clamped(to: 0..<largest)
      pool[slot] = Modelled(buffer: pool[slot].buffer.extracting(bounds), model: Array(pool[slot].model[bounds]))
    }
    for slot in Set([i, j, k]) where pool[slot].buffer.count != pool[slot].model.count {
      return "count \(pool[slot].buffer.count), the model has \(pool[slot].model.count)"
    }
    return nil
  }

  /// `copyBytes` of a random range into a destination that may be smaller.
  mutating func checkCopyBytes(_ entry: Modelled) -> String? {
    let wholeBuffer = Int.random(in: 0..<4, using: &random) == 0
    let bounds = wholeBuffer ? 0..<entry.model.count : range(in: entry.model.count)
    let capacity =
      Int.random(in: 0..<3, using: &random) == 0 ? Int.random(in: 0...bounds.count, using: &random) : bounds.count
    var destination = [UInt8](repeating: 0xA5, count: capacity + 1)
    let copied = destination.withUnsafeMutableBytes { bytes in
      entry.buffer.copyBytes(
        to: UnsafeMutableRawBufferPointer(rebasing: bytes[0..<capacity]), from: wholeBuffer ? nil : bounds)
    }
    let expected = min(capacity, bounds.count)
    if copied != expected { return "copied \(copied) of \(bounds) into \(capacity), expected \(expected)" }
    if destination[0..<copied] != entry.model[bounds.lowerBound..<(bounds.lowerBound + copied)] {
      return "the bytes of \(bounds) differ"
    }
    if destination[capacity] != 0xA5 { return "wrote past the destination's \(capacity) bytes" }
    return nil
  }

  /// `Array(_:)`, `for in`, subscripts, `withUnsafeBytes`, `withContiguousStorageIfAvailable`.
  mutating func checkIteration(_ entry: Modelled) -> String? {
    let model = entry.model
    if Array(entry.buffer) != model { return "Array(buffer) differs from the model (\(entry.buffer))" }
    var iterated: [UInt8] = []
    for byte in entry.buffer { iterated.append(byte) }
    if iterated != model { return "for-in differs from the model (\(entry.buffer))" }
    if !model.isEmpty {
      for _ in 0..<4 {
        let position = Int.random(in: 0..<model.count, using: &random)
        if entry.buffer[position] != model[position] { return "buffer[\(position)] differs" }
      }
      let bounds = range(in: model.count)
      if Array(entry.buffer[bounds]) != Array(model[bounds]) { return "buffer[\(bounds)] differs" }
    }
    if entry.buffer.withUnsafeBytes({ Array($0) }) != model { return "withUnsafeBytes differs" }
    if let contiguous = entry.buffer.withContiguousStorageIfAvailable({ Array($0) }) {
      if entry.buffer.regionCount > 1 { return "contiguous storage for \(entry.buffer.regionCount) regions" }
      if contiguous != model { return "withContiguousStorageIfAvailable differs" }
    } else if entry.buffer.regionCount <= 1 {
      return "no contiguous storage for \(entry.buffer.regionCount) region"
    }
    return nil
  }

  /// `enumerateRegions`: contiguous offsets, no empty region, `regionCount` regions, the model's bytes.
  mutating func checkRegions(_ entry: Modelled) -> String? {
    var joined: [UInt8] = []
    var regions = 0
    var failure: String?
    entry.buffer.enumerateRegions { bytes, offset in
      if offset != joined.count { failure = "region \(regions) at offset \(offset), expected \(joined.count)" }
      if bytes.isEmpty { failure = "region \(regions) is empty" }
      joined += bytes
      regions += 1
      return failure == nil
    }
    if let failure { return failure }
    if regions != entry.buffer.regionCount {
      return "\(regions) regions walked, regionCount \(entry.buffer.regionCount)"
    }
    if joined != entry.model { return "the regions' bytes differ from the model" }
    // A walk stopped early visits exactly the regions up to the stop.
    if regions > 1 {
      let stopAt = Int.random(in: 1..<regions, using: &random)
      var visited = 0
      let finished = entry.buffer.enumerateRegions { _, _ in
        visited += 1
        return visited < stopAt
      }
      if finished || visited != stopAt { return "a walk stopped at \(stopAt) visited \(visited)" }
    }
    return nil
  }
}

@Suite("DispatchBuffer properties")
struct DispatchBufferPropertyTests {
  @Test(
    "random sequences of make / append / concatenate / extract / copyBytes / iterate / compare agree with a [UInt8] model (GCD_PROPERTY_SEED replays a run)"
  )
  func modelAgreement() {
    let seed = SeededRandom.runSeed
    let steps = runningUnderSanitizer ? 10_000 : 30_000
    var machine = BufferMachine(seed: seed)
    var failure: String?
    for step in 0..<steps {
      if let found = machine.step() {
        failure = "step \(step): \(found)"
        break
      }
    }
    // Every buffer of the pool, whole, at the end.
    for (slot, entry) in machine.pool.enumerated() where failure == nil && Array(entry.buffer) != entry.model {
      failure = "at the end, pool[\(slot)] differs from its model"
    }
    #expect(failure == nil, "GCD_PROPERTY_SEED=\(seed): \(failure ?? "")")
  }
}
