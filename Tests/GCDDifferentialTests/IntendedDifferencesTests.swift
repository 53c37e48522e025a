import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// The table of intended differences lives in code (`IntendedDifference`) and in
/// docs/reliability.md; this keeps them one table.
@Suite("Differential: the table of intended differences")
struct IntendedDifferencesTests {
  @Test("docs/reliability.md shows IntendedDifference's rows, word for word")
  func documented() throws {
    // #filePath: Tests/GCDDifferentialTests/IntendedDifferencesTests.swift
    let suffix = "/Tests/GCDDifferentialTests/IntendedDifferencesTests.swift"
    let root = String(String(#filePath).dropLast(suffix.count))
    let page = try #require(readText(root + "/docs/reliability.md"))
    #expect(
      page.contains(IntendedDifference.markdownTable),
      "docs/reliability.md's table differs from IntendedDifference; it should read:\n\(IntendedDifference.markdownTable)"
    )
  }

  @Test("each row's tag names the row")
  func tags() {
    for row in IntendedDifference.allCases { #expect(row.tag.contains(row.rawValue)) }
  }

  private func readText(_ path: String) -> String? {
    guard let file = fopen(path, "r") else { return nil }
    defer { fclose(file) }
    var bytes: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65536)
    while true {
      let got = fread(&buffer, 1, buffer.count, file)
      if got <= 0 { break }
      bytes += buffer[0..<got]
    }
    return String(decoding: bytes, as: UTF8.self)
  }
}
