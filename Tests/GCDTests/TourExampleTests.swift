import Testing

/// The tour the README and the DocC landing page show (`Examples/Tour`, its `tour` region, which
/// docs/docc-listings.sh keeps equal to both): it runs, and does what its comments say.
@Suite struct TourExampleTests {
  @Test func tourRunsAsTheReadmeSays() async throws {
    let run = try await ExampleRun("Tour")
    for task in 0..<4 { run.expect("task \(task) ran", times: 1) }
    // group.wait() returned only after the four tasks: each line comes before the answer.
    let lines = run.lines
    let answer = try #require(lines.firstIndex(of: "the answer from the queue: 42"), "no answer line:\n\(run.output)")
    #expect(lines[..<answer].filter { $0.hasPrefix("task ") }.count == 4)
    #expect(lines.last == "three ticks; dropping the timer cancels it")
  }
}
