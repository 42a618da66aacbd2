-- highlight.lua: SGR style → group name and attributes; the plugin's linked groups.
local t = ...
local hl = require('agent_bash.highlight')

t.describe('style_group', function()
  local cases = {
    { {}, nil },
    { { fg = 1 }, 'AgentBashAnsi_f1' },
    { { bg = 4 }, 'AgentBashAnsi_b4' },
    { { fg = '#FF8800', bg = 232 }, 'AgentBashAnsi_fff8800_b232' },
    { { bold = true }, 'AgentBashAnsi_B' },
    { { fg = 2, bold = true, dim = true, italic = true, underline = true, reverse = true, strikethrough = true }, 'AgentBashAnsi_f2_BDIURS' },
    { { bold = false }, nil },
  }
  for _, c in ipairs(cases) do
    t.it(vim.inspect(c[1], { newline = ' ', indent = '' }), function()
      t.eq(c[2], hl.style_group(c[1]))
    end)
  end
end)

t.describe('attrs', function()
  t.it('indexed colours 0-15 use the fixed palette', function()
    vim.g.terminal_color_1 = nil
    t.eq({ fg = '#cd0000', ctermfg = 1 }, hl.attrs({ fg = 1 }))
  end)

  t.it('indexed colours 0-15 follow g:terminal_color_N', function()
    vim.g.terminal_color_1 = '#AA0000'
    t.eq({ fg = '#aa0000', ctermfg = 1 }, hl.attrs({ fg = 1 }))
    vim.g.terminal_color_1 = nil
  end)

  t.it('cube and grey ramp', function()
    t.eq('#000000', hl.hex(16))
    t.eq('#ff0000', hl.hex(196))
    t.eq('#5f87af', hl.hex(67))
    t.eq('#080808', hl.hex(232))
    t.eq('#eeeeee', hl.hex(255))
  end)

  t.it('hex colours get the nearest cterm index', function()
    t.eq({ bg = '#ff0000', ctermbg = 196 }, hl.attrs({ bg = '#FF0000' }))
    t.eq(67, hl.nearest('#5f87af'))
  end)

  t.it('flags for gui and cterm; dim without colour is grey', function()
    t.eq({ bold = true, underline = true, cterm = { bold = true, underline = true } }, hl.attrs({ bold = true, underline = true }))
    t.eq({ fg = '#7f7f7f', ctermfg = 8 }, hl.attrs({ dim = true }))
  end)
end)

t.describe('groups', function()
  t.it('links with default = true and survives :colorscheme', function()
    hl.setup()
    t.eq({ link = 'Title', default = true }, vim.api.nvim_get_hl(0, { name = 'AgentBashHeader' }))
    vim.api.nvim_set_hl(0, 'AgentBashOk', { fg = '#123456' }) -- a user's override wins
    hl.setup()
    t.eq(tonumber('123456', 16), vim.api.nvim_get_hl(0, { name = 'AgentBashOk' }).fg)
    hl.ensure('AgentBashAnsi_f1', { fg = 1 })
    vim.cmd('colorscheme default')
    t.eq('DiagnosticOk', vim.api.nvim_get_hl(0, { name = 'AgentBashOk' }).link)
    t.eq(tonumber('cd0000', 16), vim.api.nvim_get_hl(0, { name = 'AgentBashAnsi_f1' }).fg)
  end)

  t.it('dim groups get a 256-colour grey when their link has no cterm colour', function()
    hl.setup()
    vim.cmd('colorscheme default') -- Neovim's default Comment: a GUI colour only
    local comment = vim.api.nvim_get_hl(0, { name = 'Comment', link = false })
    t.eq(nil, comment.ctermfg)
    for _, name in ipairs({ 'AgentBashDim', 'AgentBashMore' }) do
      local got = vim.api.nvim_get_hl(0, { name = name, link = false })
      t.eq(244, got.ctermfg, name)
      t.eq(comment.fg, got.fg, name)
    end
    -- A scheme whose Comment has a cterm colour keeps the plain link.
    vim.cmd('hi clear AgentBashDim')
    vim.api.nvim_set_hl(0, 'Comment', { fg = '#808080', ctermfg = 3 })
    hl.setup()
    t.eq({ link = 'Comment', default = true }, vim.api.nvim_get_hl(0, { name = 'AgentBashDim' }))
    vim.cmd('colorscheme default')
  end)

  t.it('every group is documented', function()
    local doc = table.concat(vim.fn.readfile(t.root .. '/doc/agent_bash.txt'), '\n')
    for name in pairs(hl.groups) do
      t.ok(doc:find('*' .. name .. '*', 1, true), name .. ' has no help tag')
    end
  end)
end)

t.describe('bounded groups', function()
  local function ansi_groups()
    local n = 0
    for name in pairs(vim.api.nvim_get_hl(0, {})) do
      if name:find('^AgentBashAnsi_') then
        n = n + 1
      end
    end
    return n
  end

  t.it('thousands of truecolour styles never make more than max_named + max_recycled groups', function()
    local before = ansi_groups()
    local used = {}
    for i = 1, 5000 do
      local fg = ('#%06x'):format((i * 2654435761) % 0x1000000)
      local style = { fg = fg, bold = i % 2 == 0 }
      local group = hl.ensure(hl.style_group(style), style)
      used[#used + 1] = { group, fg }
      -- The group just returned carries this style, whatever was recycled for it.
      t.eq(tonumber(fg:sub(2), 16), vim.api.nvim_get_hl(0, { name = group }).fg)
    end
    t.ok(ansi_groups() - before <= hl.max_named + hl.max_recycled, 'groups made: ' .. (ansi_groups() - before))
    t.ok(ansi_groups() >= hl.max_named, 'named groups were used first')
    -- The most recent styles still hold their colours.
    for i = #used - hl.max_recycled + 1, #used do
      t.eq(tonumber(used[i][2]:sub(2), 16), vim.api.nvim_get_hl(0, { name = used[i][1] }).fg)
    end
  end)

  t.it('a style used again keeps its group; the least recently used one is recycled', function()
    local keep = { fg = '#010203' }
    local keep_group = hl.ensure(hl.style_group(keep), keep)
    for i = 1, hl.max_recycled - 1 do
      local s = { fg = ('#%06x'):format(0x200000 + i) }
      hl.ensure(hl.style_group(s), s)
      t.eq(keep_group, hl.ensure(hl.style_group(keep), keep)) -- used again: stays
    end
    for i = 1, hl.max_recycled do
      local s = { fg = ('#%06x'):format(0x300000 + i) }
      hl.ensure(hl.style_group(s), s)
    end
    local again = hl.ensure(hl.style_group(keep), keep)
    t.eq(tonumber('010203', 16), vim.api.nvim_get_hl(0, { name = again }).fg)
  end)

  t.it('recycled groups survive :colorscheme', function()
    local s = { fg = '#0a0b0c' }
    local group = hl.ensure(hl.style_group(s), s)
    vim.cmd('colorscheme default')
    t.eq(tonumber('0a0b0c', 16), vim.api.nvim_get_hl(0, { name = group }).fg)
  end)
end)
