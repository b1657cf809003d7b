#[memtrack::memtrack]
async fn fetch() {}

fn main() {}
